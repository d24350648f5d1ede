"""GAE against a 3-step example worked out by hand, with a time-limit truncation in it."""

from types import SimpleNamespace

import numpy as np

from rlstack.buffers import compute_gae, rollout_batch


def test_gae_hand_example_with_truncation():
    # gamma = lam = 0.5; the episode is truncated after step 1 with V(final_obs) = 4,
    # which the trainer folds into the reward: r1 = 2 + 0.5 * 4 = 4.
    reward = np.array([[1.0], [2.0 + 0.5 * 4.0], [3.0]], np.float32)
    value = np.array([[0.5], [1.0], [1.5]], np.float32)
    done = np.array([[False], [True], [False]])
    last_value = np.array([2.0], np.float32)
    adv, ret = compute_gae(reward, value, done, last_value, gamma=0.5, lam=0.5)
    # t=2: delta = 3 + 0.5*2 - 1.5 = 2.5                  -> A2 = 2.5
    # t=1: episode cut, delta = 4 - 1 = 3                  -> A1 = 3.0
    # t=0: delta = 1 + 0.5*1 - 0.5 = 1; A0 = 1 + 0.25*3    -> A0 = 1.75
    np.testing.assert_allclose(adv[:, 0], [1.75, 3.0, 2.5])
    np.testing.assert_allclose(ret[:, 0], [2.25, 4.0, 4.0])


def test_gae_lambda_one_is_discounted_return_minus_value():
    rng = np.random.default_rng(0)
    reward = rng.standard_normal((5, 2)).astype(np.float32)
    value = rng.standard_normal((5, 2)).astype(np.float32)
    done = np.zeros((5, 2), bool)
    last = rng.standard_normal(2).astype(np.float32)
    adv, _ = compute_gae(reward, value, done, last, gamma=0.9, lam=1.0)
    g = last.astype(np.float64)
    for t in reversed(range(5)):
        g = reward[t] + 0.9 * g
        np.testing.assert_allclose(adv[t], g - value[t], rtol=1e-5, atol=1e-5)


def test_rollout_batch_flattens_time_major_and_bootstraps_truncations():
    t, n = 2, 3
    zeros = np.zeros((t, n), np.float32)
    truncated = np.zeros((t, n), bool)
    truncated[1, 2] = True  # env 2's episode is cut by a time limit at the last step
    final_value = zeros.copy()
    final_value[1, 2] = 5.0
    traj = SimpleNamespace(obs=np.stack([np.full((n, 4), s, np.float32) for s in range(t)]),
                           action=np.stack([np.arange(n) + 10 * s for s in range(t)]).astype(np.int32),
                           logp=zeros, value=zeros, reward=np.ones((t, n), np.float32), terminated=zeros > 0,
                           truncated=truncated, final_value=final_value, last_value=np.full(n, 2.0, np.float32))
    batch = rollout_batch(traj, 0.5, 1.0)
    assert batch.obs.shape == (6, 4) and batch.action.tolist() == [0, 1, 2, 10, 11, 12]
    # env 0 runs on: 1 + 0.5 * (1 + 0.5 * 2); env 2 is cut: 1 + 0.5 * (1 + 0.5 * 5) (the final obs's value)
    np.testing.assert_allclose(batch.ret.reshape(t, n)[0], [2.0, 2.0, 2.75])
