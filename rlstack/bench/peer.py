"""`python -m rlstack.bench peer --python VENV/bin/python`: rlstack against Stable-Baselines3,
side by side in one session, same hyperparameters (the shipped configs: RL Baselines3 Zoo's).

Stable-Baselines3 is not a dependency: install it (with PyTorch for the CPU) in a scratch venv
and pass its interpreter. For each algorithm this trains rlstack's shipped config in this process,
then the same hyperparameters with SB3 in the other interpreter, and prints steps/s (wall time
from building the agent to the end of training, compilation included on both sides; periodic
evaluation off on both) and their ratio, as lines and JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time

_STARTING_ENV = dict(os.environ)  # before anything imports MindSpore

CONFIGS = {"ppo": "ppo_cartpole", "dqn": "dqn_cartpole", "sac": "sac_pendulum"}

SB3_SCRIPT = r"""
import json, sys, time
import torch
from stable_baselines3 import DQN, PPO, SAC
from stable_baselines3.common.env_util import make_vec_env

spec = json.loads(sys.argv[1])
torch.manual_seed(spec["seed"])
def schedule(value):
    if isinstance(value, str) and value.startswith("lin_"):
        start = float(value[4:])
        return lambda remaining: remaining * start
    return float(value)

t0 = time.perf_counter()
env = make_vec_env(spec["env"], n_envs=spec["n_envs"], seed=spec["seed"])
activation = {"tanh": torch.nn.Tanh, "relu": torch.nn.ReLU}[spec["activation"]]
kwargs = {k: schedule(v) if k in ("learning_rate", "clip_range") else v for k, v in spec["kwargs"].items()}
algo = {"ppo": PPO, "dqn": DQN, "sac": SAC}[spec["algo"]]
model = algo("MlpPolicy", env, seed=spec["seed"], device="cpu", verbose=0,
             policy_kwargs={"net_arch": spec["hidden"], "activation_fn": activation}, **kwargs)
model.learn(total_timesteps=spec["total_steps"])
seconds = time.perf_counter() - t0
print(json.dumps({"seconds": seconds, "steps": spec["total_steps"], "torch": torch.__version__,
                  "threads": torch.get_num_threads()}))
"""


def sb3_spec(algo: str, cfg) -> dict:
    """The SB3 constructor arguments equal to rlstack's config `cfg`."""
    t = cfg.train
    if algo == "ppo":
        kwargs = {"n_steps": t.n_steps, "batch_size": t.batch_size, "n_epochs": t.n_epochs, "gamma": t.gamma,
                  "gae_lambda": t.gae_lambda, "ent_coef": t.ent_coef, "vf_coef": t.vf_coef,
                  "max_grad_norm": t.max_grad_norm, "learning_rate": t.lr, "clip_range": t.clip_range}
    else:
        kwargs = {"learning_rate": t.lr, "batch_size": t.batch_size, "buffer_size": t.buffer_size,
                  "learning_starts": t.learning_starts, "gamma": t.gamma, "train_freq": t.train_freq,
                  "gradient_steps": t.gradient_steps, "target_update_interval": t.target_update_interval}
        if algo == "dqn":
            kwargs.update(exploration_fraction=t.exploration_fraction, exploration_final_eps=t.exploration_final_eps)
        else:
            kwargs.update(tau=t.tau)
    return {"algo": algo, "env": cfg.env.id, "n_envs": cfg.env.n_envs, "seed": cfg.seed,
            "total_steps": t.total_steps, "hidden": list(cfg.net.hidden), "activation": cfg.net.activation,
            "kwargs": kwargs}


def peer_env() -> dict[str, str]:
    """The environment this command started with: MindSpore changes its own on import (e.g.
    LD_LIBRARY_PATH to its CPU plugins, with which PyTorch ran single-threaded), and SB3 should
    run as a user's would."""
    return dict(_STARTING_ENV)


def run_rlstack(cfg) -> dict:
    """Trainer construction to the end of training (the final export and evaluation are not
    counted: SB3's `learn` does neither)."""
    from rlstack.trainer import Trainer

    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        trainer = Trainer(cfg, out)
        build = time.perf_counter() - start
        summary = trainer.train()
    return {"seconds": build + summary["wall_seconds"], "steps": summary["total_steps"],
            "eval_mean_return": summary["eval/mean_return"], "time_split_seconds": summary["time_split_seconds"]}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlstack.bench peer", description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", required=True, help="interpreter of a venv with stable-baselines3 and torch")
    parser.add_argument("--algos", default="ppo,dqn,sac", help="comma-separated: ppo, dqn, sac")
    parser.add_argument("--repeats", type=int, default=1,
                        help="runs of each side, alternating rlstack and SB3; the medians are compared (the "
                             "speed of a shared machine drifts by 10-20%% within minutes)")
    parser.add_argument("--json", default=None, help="also write the results to this file")
    args = parser.parse_args(argv)

    from rlstack.config import load_config

    rows = []
    for algo in args.algos.split(","):
        # No periodic evaluation (SB3's `learn` runs none); everything else as shipped.
        cfg = load_config(CONFIGS[algo], ["train.progress=off", "train.eval_every=0", "train.keep_best=false"])
        ours, peers = [], []
        for _ in range(args.repeats):
            ours.append({"load_average": os.getloadavg()[0], **run_rlstack(cfg)})
            load = os.getloadavg()[0]
            peers.append({"load_average": load, **json.loads(
                subprocess.run([args.python, "-c", SB3_SCRIPT, json.dumps(sb3_spec(algo, cfg))], check=True,
                               capture_output=True, text=True, env=peer_env()).stdout.strip().splitlines()[-1])})
        rates = [r["steps"] / r["seconds"] for r in ours]
        peer_rates = [r["steps"] / r["seconds"] for r in peers]
        row = {"algo": algo, "env": cfg.env.id, "total_steps": cfg.train.total_steps,
               "rlstack_steps_per_second": round(statistics.median(rates), 1),
               "sb3_steps_per_second": round(statistics.median(peer_rates), 1),
               "rlstack": ours[0] if args.repeats == 1 else ours, "sb3": peers[0] if args.repeats == 1 else peers}
        row["ratio"] = round(row["rlstack_steps_per_second"] / row["sb3_steps_per_second"], 2)
        rows.append(row)
        spread = "" if args.repeats == 1 else (
            f" [medians of {args.repeats}; rlstack {min(rates):,.0f}-{max(rates):,.0f}, "
            f"SB3 {min(peer_rates):,.0f}-{max(peer_rates):,.0f}]")
        print(f"{algo} {cfg.env.id} {cfg.train.total_steps:,} steps: rlstack {row['rlstack_steps_per_second']:,.0f} "
              f"steps/s, SB3 {row['sb3_steps_per_second']:,.0f} steps/s (torch {peers[0]['torch']}, "
              f"{peers[0]['threads']} threads): {row['ratio']:.2f}x{spread}", flush=True)
    print(json.dumps(rows, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return 0
