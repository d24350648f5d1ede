"""Deterministic evaluation of the live network, and the best evaluation of a run (`train.keep_best`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from mindspore import Tensor

from rlstack.acting import Acting
from rlstack.config import Config, to_dict
from rlstack.envs import make_vector_env
from rlstack.logger import mean_or_none


def evaluate(network: Any, cfg: Config, episodes: int, seed: int) -> np.ndarray:
    """Deterministic returns of `episodes` episodes, run side by side (one graph call per step)."""
    envs = make_vector_env(cfg.env.id, episodes, "sync", cfg.env.kwargs, cfg.env.vectorization,
                           imports=cfg.env.imports, wrappers=cfg.env.wrappers, training=False)
    acting = Acting.of_network(network, envs.single_observation_space, envs.single_action_space)
    obs, _ = envs.reset(seed=seed)
    returns = np.zeros(episodes)
    running = np.ones(episodes, bool)
    zeros = acting.noise(episodes, None)
    while running.any():
        action = acting(obs, zeros).action
        obs, reward, terminated, truncated, _ = envs.step(acting.to_env(action))
        returns += reward * running
        running &= ~(terminated | truncated)
    envs.close()
    return returns


@dataclass
class BestEval:
    """The best periodic deterministic evaluation of a run and the parameters that scored it."""

    mean_return: float
    steps: int
    params: dict[str, np.ndarray]
    rank: tuple[float, ...]
    """What "best" compares, larger is better: `(mean_return,)`, or on the games
    (-losses vs perfect play, -losses vs minimax, -losses vs random, wins vs random)."""


BEST_FILE = "best.npz"
"""Name of the best evaluation's file inside a checkpoint directory."""


class BestKeeper:
    """Keeps the network's parameters of the best evaluation so far; saved with every checkpoint
    (`save`/`load`), so `--resume` continues the comparison and `keep_best` still holds."""

    def __init__(self, network: Any):
        self.network = network
        self.best: BestEval | None = None

    def consider(self, mean_return: float, rank: tuple[float, ...], steps: int) -> bool:
        """Keep the parameters if `rank` beats the best so far (the earliest wins a tie)."""
        if self.best is not None and tuple(rank) <= self.best.rank:
            return False
        params = {p.name: p.asnumpy().copy() for p in self.network.get_parameters()}
        self.best = BestEval(mean_return, steps, params, tuple(rank))
        return True

    def restore(self) -> None:
        """Put the best evaluation's parameters back into the network."""
        for p in self.network.get_parameters():
            p.set_data(Tensor(self.best.params[p.name]))

    def save(self, path: Path) -> None:
        if self.best is None:
            return
        b = self.best
        meta = json.dumps({"mean_return": b.mean_return, "steps": b.steps, "rank": list(b.rank)})
        with open(path, "wb") as f:  # inside the checkpoint's temp directory, renamed whole
            np.savez(f, __meta__=np.frombuffer(meta.encode(), np.uint8), **b.params)

    def load(self, path: Path) -> None:
        with np.load(path) as data:
            meta = json.loads(bytes(data["__meta__"]).decode())
            params = {k: data[k] for k in data.files if k != "__meta__"}
        self.best = BestEval(float(meta["mean_return"]), int(meta["steps"]), params, tuple(meta["rank"]))


class PeriodicEval:
    """`train.eval_every`: a deterministic evaluation once the step counter passes the next
    multiple; each is offered to the `BestKeeper` (`train.keep_best`)."""

    def __init__(self, cfg: Config, network: Any, keeper: BestKeeper):
        self.cfg, self.network, self.keeper = cfg, network, keeper
        self.next_eval = cfg.train.eval_every

    def due(self, steps: int) -> bool:
        return bool(self.cfg.train.eval_every) and steps >= self.next_eval

    def run(self, steps: int, log: Any) -> float:
        every = self.cfg.train.eval_every
        self.next_eval = (steps // every + 1) * every
        returns = evaluate(self.network, self.cfg, self.cfg.env.eval_episodes, self.cfg.seed + 20_000)
        mean = float(returns.mean())
        log.scalars({"eval/mean_return": mean, "eval/std_return": float(returns.std())}, steps)
        if self.keeper.consider(mean, (mean,), steps):
            log.message(f"eval at {steps:,} steps: mean return {mean:.2f} (best so far)")
        return mean


def run_summary(cfg: Config, counters: Any, returns: np.ndarray, best: BestEval | None, from_best: bool,
                version: str, steps_per_second: float, split: dict[str, float], parity: dict[str, Any]) -> dict[str, Any]:
    """`summary.json` of a finished run: the final evaluation's `returns` and the run's counters."""
    c = counters
    return {
        "eval/mean_return": float(returns.mean()), "eval/std_return": float(returns.std()),
        "eval/returns": returns.tolist(), "total_steps": c.steps, "updates": c.updates,
        "episodes": c.episodes,
        "rollout/ep_return_mean": mean_or_none(c.recent_returns),
        "wall_seconds": c.wall_seconds, "steps_per_second": steps_per_second, "time_split_seconds": split,
        "seed": cfg.seed, "algo": cfg.algo, "env": cfg.env.id, "policy_version": version,
        "eval/best_mean_return": best.mean_return if best else None,
        "eval/best_steps": best.steps if best else None,
        "final_policy": "best" if from_best else "last",
        **parity,
        "config": to_dict(cfg),
    }
