"""The collector: one env loop for the in-process actor and the actor processes."""

import mindspore as ms
import numpy as np

from rlstack.acting import Acting
from rlstack.collector import Collector, LocalSource, trajectory_specs
from rlstack.envs import make_vector_env
from rlstack.network import NetSpec, Network, PolicyKind


def _pendulum(n_envs: int, steps: int):
    envs = make_vector_env("Pendulum-v1", n_envs, "sync", {"max_episode_steps": 5})
    ms.set_seed(0)
    net = Network(envs.single_observation_space, envs.single_action_space, NetSpec(policy=PolicyKind.GAUSSIAN,
                                                                                     log_std_init=1.0))
    acting = Acting.of_network(net, envs.single_observation_space, envs.single_action_space, updates=3)
    return envs, acting


def test_on_policy_chunks_bootstrap_truncations_and_count_episodes():
    envs, acting = _pendulum(2, 8)
    specs = trajectory_specs(8, 2, (3,), (1,), "float32", off_policy=False)
    source = LocalSource(Collector(envs, acting, seed=1, off_policy=False), specs, lambda t: False)
    traj = source.get()
    assert traj.obs.shape == (8, 2, 3) and traj.next_obs is None and np.all(traj.version == 3)
    np.testing.assert_array_equal(traj.truncated[:, 0], [0, 0, 0, 0, 1, 0, 0, 0])  # cut after 5 steps
    assert not traj.terminated.any() and list(traj.episode_lengths) == [5, 5]
    # V(final_obs) where an episode was cut, 0 elsewhere; V(last obs) for GAE.
    assert np.all(traj.final_value[4] != 0) and not np.any(np.delete(traj.final_value, 4, 0))
    np.testing.assert_array_equal(traj.last_value, acting(traj.last_obs, acting.noise(2, None)).value)
    # The stored action is the raw sample (its logp refers to it): with log std 1 some leave the Box.
    assert np.abs(traj.action).max() > 2.0
    np.testing.assert_allclose(traj.episode_returns.sum(), traj.reward[:5].sum(), rtol=1e-6)
    second = source.get()  # the env loop goes on where it stopped
    assert list(second.episode_lengths) == [5] * 4 and second.truncated[[1, 6]].all()  # steps 10 and 15


def test_off_policy_chunks_store_real_next_obs_env_actions_and_explore_first():
    envs, acting = _pendulum(1, 6)
    specs = trajectory_specs(6, 1, (3,), (1,), "float32", off_policy=True)
    left = [9]
    source = LocalSource(Collector(envs, acting, seed=2, off_policy=True), specs, lambda t: t < 2,
                         remaining=lambda: left[0])
    traj = source.get()
    assert np.all(traj.logp[:2] == 0) and np.all(traj.logp[2:] != 0)  # uniform actions, then the policy
    assert np.abs(traj.action).max() <= 2.0  # what the env received: clipped to the Box
    assert traj.truncated[4, 0] and not np.array_equal(traj.next_obs[4], traj.obs[5])  # final obs, not reset obs
    np.testing.assert_array_equal(traj.next_obs[:4], traj.obs[1:5])
    left[0] = 2
    assert source.get().reward.shape == (2, 1)  # the last chunk is cut short at the step budget
