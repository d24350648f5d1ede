"""`python -m rlstack.bench peer --python VENV/bin/python`: rlstack against Stable-Baselines3,
side by side in one session, same hyperparameters (the shipped configs: RL Baselines3 Zoo's).

Stable-Baselines3 is not a dependency: install it (with PyTorch for the CPU, and the extras the
environment needs: ale-py and opencv-python-headless for Atari, minatar for MinAtar) in a scratch
venv and pass its interpreter. For each config this trains rlstack here, then the same
hyperparameters with SB3 in the other interpreter, and prints steps/s (wall time from building the
agent to the end of training, compilation included on both sides; periodic evaluation off on both)
and their ratio, as lines and JSON. With `--evaluate` both sides' final deterministic evaluation
is compared too (rlstack's `env.eval_episodes` games; SB3's `evaluate_policy` over as many).

Frames: Atari runs through SB3's own Atari wrappers (`make_atari_env`, 4 frames stacked by
`VecFrameStack`) and its `CnnPolicy` (Nature CNN, as `net.encoder: nature_cnn`); MinAtar through
`CnnPolicy` with MinAtar's network as the features extractor (as `net.encoder: minatar_cnn`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from rlstack.plot import PEER_RESULT, PEER_SPEC

_STARTING_ENV = dict(os.environ)  # before anything imports MindSpore

CONFIGS = {"ppo": "ppo_cartpole", "dqn": "dqn_cartpole", "sac": "sac_pendulum", "td3": "td3_pendulum"}
"""`--algos` names -> the shipped config each runs (`--configs` names configs directly)."""

SB3_BUILD = r"""
import json, sys, time
import gymnasium as gym
import numpy as np
import torch
from stable_baselines3 import DQN, PPO, SAC, TD3
from stable_baselines3.common.noise import NormalActionNoise, OrnsteinUhlenbeckActionNoise
from stable_baselines3.common.env_util import make_atari_env, make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.torch_layers import BaseFeaturesExtractor
from stable_baselines3.common.vec_env import SubprocVecEnv, VecFrameStack, VecNormalize

spec = json.loads(sys.argv[1])
torch.manual_seed(spec["seed"])
def schedule(value):
    if isinstance(value, str) and value.startswith("lin_"):
        start = float(value[4:])
        return lambda remaining: remaining * start
    return float(value)

class MinAtarCNN(BaseFeaturesExtractor):
    # Young and Tian 2019, rlstack's `minatar_cnn`: 16x3x3/1, ReLU, dense 128, ReLU on [H, W, C] planes.
    def __init__(self, observation_space, features_dim=128):
        super().__init__(observation_space, features_dim)
        h, w, c = observation_space.shape
        self.net = torch.nn.Sequential(torch.nn.Conv2d(c, 16, 3, 1), torch.nn.ReLU(), torch.nn.Flatten(),
                                       torch.nn.Linear(16 * (h - 2) * (w - 2), features_dim), torch.nn.ReLU())
    def forward(self, obs):
        return self.net(obs.permute(0, 3, 1, 2))

def make(n_envs, seed):
    # The processes of SubprocVecEnv forked, so they have the ids registered here.
    subproc = spec["vector"] == "async" and n_envs > 1
    vec = {"vec_env_cls": SubprocVecEnv, "vec_env_kwargs": {"start_method": "fork"}} if subproc else {}
    if spec["family"] == "atari":
        import ale_py
        gym.register_envs(ale_py)
        return VecFrameStack(make_atari_env(spec["env"], n_envs=n_envs, seed=seed, **vec), 4)
    if spec["family"] == "minatar":
        import minatar.gym
        minatar.gym.register_envs()
    return make_vec_env(spec["env"], n_envs=n_envs, seed=seed, **vec)

t0 = time.perf_counter()
env = make(spec["n_envs"], spec["seed"])
norm = spec["normalize"]
if norm is not None:  # the Zoo's `normalize`: VecNormalize with the algorithm's gamma
    env = VecNormalize(env, norm_obs=norm["obs"], norm_reward=norm["reward"], clip_obs=norm["clip_obs"],
                       clip_reward=norm["clip_reward"], gamma=norm["gamma"])
activation = {"tanh": torch.nn.Tanh, "relu": torch.nn.ReLU}[spec["activation"]]
kwargs = {k: schedule(v) if k in ("learning_rate", "clip_range") else v for k, v in spec["kwargs"].items()}
policy_kwargs = {"net_arch": spec["hidden"], "activation_fn": activation, **spec["policy_kwargs"]}
if spec["encoder"] == "minatar_cnn":
    policy_kwargs["features_extractor_class"] = MinAtarCNN
if spec["action_noise"] is not None:  # TD3's exploration noise on the scaled action
    dim, noise = env.action_space.shape[-1], spec["action_noise"]
    noise_class = NormalActionNoise if noise["type"] == "normal" else OrnsteinUhlenbeckActionNoise
    kwargs["action_noise"] = noise_class(np.zeros(dim), np.full(dim, noise["std"]))
algo = {"ppo": PPO, "dqn": DQN, "sac": SAC, "td3": TD3}[spec["algo"]]
model = algo(spec["policy"], env, seed=spec["seed"], device="cpu", verbose=0, policy_kwargs=policy_kwargs,
             tensorboard_log=spec["tensorboard"], **kwargs)
"""
"""The SB3 model of `spec` (`sb3_spec`) as `model`, its env as `env`; `t0` when building began."""

SB3_SCRIPT = SB3_BUILD + r"""
model.learn(total_timesteps=spec["total_steps"])
seconds = time.perf_counter() - t0
result = {"seconds": seconds, "steps": int(model.num_timesteps), "torch": torch.__version__,
          "threads": torch.get_num_threads()}
if spec["eval_episodes"]:
    # Whole games' scores: the Monitor under SB3's Atari wrappers counts games, not lives, and
    # records rewards before clipping (evaluate_policy reads it).
    eval_env = make(1, spec["seed"] + 10_000)
    if norm is not None:  # the training statistics, frozen; the env's own rewards
        eval_env = VecNormalize(eval_env, training=False, norm_obs=norm["obs"], norm_reward=False,
                                clip_obs=norm["clip_obs"])
        eval_env.obs_rms = env.obs_rms
    returns, _ = evaluate_policy(model, eval_env, n_eval_episodes=spec["eval_episodes"], deterministic=True,
                                 return_episode_rewards=True)
    result["eval_returns"] = [float(r) for r in returns]
    result["eval_mean_return"] = sum(returns) / len(returns)
print(json.dumps(result))
"""


def env_family(env_id: str) -> str | None:
    """`atari`, `minatar` or None (any other gymnasium id)."""
    from rlstack.envs.make import is_atari

    if is_atari(env_id):
        return "atari"
    return "minatar" if env_id.startswith("MinAtar/") else None


def sb3_spec(cfg, evaluate: bool = False, tensorboard: str | None = None) -> dict:
    """The SB3 constructor arguments equal to rlstack's config `cfg`."""
    from rlstack.encoders import resolve_encoder
    from rlstack.envs.make import make_env

    t, algo = cfg.train, cfg.algo
    action_noise, policy_kwargs = None, {}
    normalize_reward = algo == "ppo" and t.normalize_reward
    normalize = None if not (cfg.net.normalize_obs or normalize_reward) else {
        "obs": cfg.net.normalize_obs, "reward": normalize_reward, "clip_obs": cfg.net.obs_clip,
        "clip_reward": t.clip_reward if normalize_reward else 10.0, "gamma": t.gamma}
    if algo == "ppo":
        kwargs = {"n_steps": t.n_steps, "batch_size": t.batch_size, "n_epochs": t.n_epochs, "gamma": t.gamma,
                  "gae_lambda": t.gae_lambda, "ent_coef": t.ent_coef, "vf_coef": t.vf_coef,
                  "max_grad_norm": t.max_grad_norm, "learning_rate": t.lr, "clip_range": t.clip_range}
        policy_kwargs = {"ortho_init": cfg.net.ortho_init, "log_std_init": cfg.net.log_std_init}
    else:
        kwargs = {"learning_rate": t.lr, "batch_size": t.batch_size, "buffer_size": t.buffer_size,
                  "learning_starts": t.learning_starts, "gamma": t.gamma, "train_freq": t.train_freq,
                  "gradient_steps": t.gradient_steps}
        if algo == "dqn":
            kwargs.update(exploration_fraction=t.exploration_fraction, exploration_final_eps=t.exploration_final_eps,
                          exploration_initial_eps=t.exploration_initial_eps,
                          target_update_interval=t.target_update_interval)
        elif algo == "sac":
            kwargs.update(tau=t.tau, target_update_interval=t.target_update_interval)
        else:
            kwargs.update(tau=t.tau, policy_delay=t.policy_delay, target_policy_noise=t.target_policy_noise,
                          target_noise_clip=t.target_noise_clip)
            action_noise = None if t.noise_type == "none" else {"type": t.noise_type, "std": t.noise_std}
    env = make_env(cfg.env.id, cfg.env.kwargs, imports=cfg.env.imports)
    encoder = resolve_encoder(cfg.net.encoder, env.observation_space)
    env.close()
    return {"algo": algo, "env": cfg.env.id, "family": env_family(cfg.env.id), "n_envs": cfg.env.n_envs,
            "vector": cfg.env.vector, "seed": cfg.seed, "total_steps": t.total_steps,
            "policy": "MlpPolicy" if encoder == "mlp" else "CnnPolicy", "encoder": encoder,
            "hidden": list(cfg.net.hidden), "activation": cfg.net.activation, "kwargs": kwargs,
            "action_noise": action_noise, "normalize": normalize, "policy_kwargs": policy_kwargs,
            "eval_episodes": cfg.env.eval_episodes if evaluate else 0, "tensorboard": tensorboard}


def peer_env() -> dict[str, str]:
    """The environment this command started with: MindSpore changes its own on import (e.g.
    LD_LIBRARY_PATH to its CPU plugins, with which PyTorch ran single-threaded), and SB3 should
    run as a user's would."""
    return dict(_STARTING_ENV)


def run_rlstack(cfg, out: str) -> dict:
    """Trainer construction to the end of training (the final export and evaluation are not
    counted: SB3's `learn` does neither)."""
    from rlstack.trainer import Trainer

    start = time.perf_counter()
    trainer = Trainer(cfg, out)
    build = time.perf_counter() - start
    summary = trainer.train()
    return {"seconds": build + summary["wall_seconds"], "steps": summary["total_steps"],
            "eval_mean_return": summary["eval/mean_return"], "eval_returns": summary["eval/returns"],
            "time_split_seconds": summary["time_split_seconds"]}


def run_sb3(python: str, spec: dict, script: str = SB3_SCRIPT) -> dict:
    """`script` (training by default) in the peer's interpreter on `spec`: its last line's JSON."""
    proc = subprocess.run([python, "-c", script, json.dumps(spec)], capture_output=True, text=True,
                          env=peer_env())
    if proc.returncode:
        raise SystemExit(f"Stable-Baselines3 run failed ({python}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


SIDES = {"rlstack": "rlstack", "sb3": "SB3"}
"""`--sides` names -> their labels in the printed lines."""


def _median_row(name: str, cfg, runs: dict[str, list[dict]], evaluate: bool) -> dict:
    """One config and seed: each side's median steps/s (and final evaluations) from `runs` (side ->
    its repeats); with both sides, their ratio."""
    rates = {side: [r["steps"] / r["seconds"] for r in side_runs] for side, side_runs in runs.items()}
    row = {"config": name, "algo": cfg.algo, "env": cfg.env.id, "seed": cfg.seed,
           "total_steps": cfg.train.total_steps}
    row.update({f"{side}_steps_per_second": round(statistics.median(r), 1) for side, r in rates.items()})
    row.update({side: side_runs[0] if len(side_runs) == 1 else side_runs for side, side_runs in runs.items()})
    line = f"{name} seed {cfg.seed} {cfg.env.id} {cfg.train.total_steps:,} steps: " + ", ".join(
        f"{SIDES[side]} {row[f'{side}_steps_per_second']:,.0f} steps/s" for side in runs)
    if len(runs) == 2:
        ours, peers = rates["rlstack"], rates["sb3"]
        row["ratio"] = round(row["rlstack_steps_per_second"] / row["sb3_steps_per_second"], 2)
        spread = "" if len(ours) == 1 else (
            f" [medians of {len(ours)}; rlstack {min(ours):,.0f}-{max(ours):,.0f}, "
            f"SB3 {min(peers):,.0f}-{max(peers):,.0f}]")
        torch = runs["sb3"][0]
        line += f" (torch {torch['torch']}, {torch['threads']} threads): {row['ratio']:.2f}x{spread}"
    if evaluate:
        row.update({f"{side}_eval": [r["eval_mean_return"] for r in side_runs] for side, side_runs in runs.items()})
        line += f"; final evaluation over {cfg.env.eval_episodes} episodes: " + ", ".join(
            f"{SIDES[side]} {', '.join(f'{v:.2f}' for v in row[f'{side}_eval'])}" for side in runs)
    print(line, flush=True)
    return row


FIXED = ("train.progress=off", "train.eval_every=0", "train.keep_best=false")
"""Overrides of every compared run: no periodic evaluation (SB3's `learn` runs none)."""


def compare(name: str, cfg, sides: list[str], repeats: int, python: str | None, evaluate: bool,
            keep: Path | None, scratch: str) -> dict:
    """Config `cfg` (named `name`) on each side in `sides`, `repeats` times alternating; its row
    (`_median_row`). `keep`: rlstack's run directories and SB3's TensorBoard logs go under it
    (`rlstack/<tag>`, `sb3/<tag>`), else under `scratch`."""
    runs: dict[str, list[dict]] = {side: [] for side in sides}
    base = keep if keep is not None else Path(scratch)
    for repeat in range(repeats):
        tag = f"{name}_seed{cfg.seed}_{repeat}"
        if "rlstack" in runs:
            runs["rlstack"].append({"load_average": os.getloadavg()[0],
                                    **run_rlstack(cfg, str(base / "rlstack" / tag))})
        if "sb3" in runs:
            spec = sb3_spec(cfg, evaluate, str(base / "sb3" / tag) if keep is not None else None)
            if keep is not None:  # what ran, for `python -m rlstack.plot` (labels, seeds)
                (base / "sb3" / tag).mkdir(parents=True, exist_ok=True)
                (base / "sb3" / tag / PEER_SPEC).write_text(json.dumps(spec, indent=2))
            runs["sb3"].append({"load_average": os.getloadavg()[0], **run_sb3(python, spec)})
            if keep is not None:  # its final evaluation, for the plot
                (base / "sb3" / tag / PEER_RESULT).write_text(json.dumps(runs["sb3"][-1], indent=2))
    return _median_row(name, cfg, runs, evaluate)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlstack.bench peer", description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", required=True, help="interpreter of a venv with stable-baselines3 and torch")
    parser.add_argument("--algos", default="ppo,dqn,sac",
                        help=f"comma-separated names of {CONFIGS} (ignored with --configs)")
    parser.add_argument("--configs", default=None,
                        help="comma-separated shipped config names or YAML paths, e.g. ppo_atari,dqn_minatar")
    parser.add_argument("--seeds", default=None, help="comma-separated seeds (default: each config's own)")
    parser.add_argument("--repeats", type=int, default=1,
                        help="runs of each side, alternating rlstack and SB3; the medians are compared (the "
                             "speed of a shared machine drifts by 10-20%% within minutes)")
    parser.add_argument("--evaluate", action="store_true",
                        help="compare the final deterministic evaluations too (env.eval_episodes games a side)")
    parser.add_argument("--keep", default=None,
                        help="keep rlstack's run directories and SB3's TensorBoard logs under this directory "
                             "(learning curves for `python -m rlstack.plot`)")
    parser.add_argument("--sides", default="rlstack,sb3", choices=["rlstack,sb3", "rlstack", "sb3"],
                        help="run one side only (a long run's learning curve, to compare with the other side's "
                             "kept run; no speed ratio is printed)")
    parser.add_argument("--json", default=None, help="also write the results to this file")
    parser.add_argument("overrides", nargs="*", help="KEY=VALUE config overrides for both sides, "
                                                     "e.g. train.total_steps=100000")
    args = parser.parse_args(argv)

    from rlstack.config import load_config

    sides = args.sides.split(",")
    names = args.configs.split(",") if args.configs else [CONFIGS[a] for a in args.algos.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        keep = Path(args.keep) if args.keep else None
        for name in names:
            seeds = [None] if args.seeds is None else [int(s) for s in args.seeds.split(",")]
            for seed in seeds:
                extra = [] if seed is None else [f"seed={seed}"]
                cfg = load_config(name, [*FIXED, *args.overrides, *extra])
                rows.append(compare(Path(name).stem, cfg, sides, args.repeats, args.python, args.evaluate, keep,
                                    scratch))
    print(json.dumps(rows, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return 0
