"""`python -m rlstack.record <run dir> [--episodes 3] [--out agent.gif]`: a video of the trained agent.

Runs the *exported* policy graph (`rlstack.load_policy`, the same MindIR the actors and the server
run, deterministic by default) in the run's environment with `render_mode="rgb_array"` and writes
the frames as a GIF (Pillow, through imageio) or an MP4 (needs the `imageio-ffmpeg` package).
The environment id and its kwargs come from the run's `config.yaml` (or the policy manifest).
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from rlstack.errors import RlstackError

FORMATS = (".gif", ".mp4")


class RecordError(RlstackError, RuntimeError):
    """The agent cannot be recorded (no policy, env cannot render, unsupported output)."""


@dataclass(frozen=True)
class Recording:
    path: Path
    frames: int
    returns: list[float]
    lengths: list[int]


def _env_settings(run_dir: Path, manifest: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    config = run_dir / "config.yaml"
    if config.is_file():
        env = (yaml.safe_load(config.read_text()) or {}).get("env", {})
        if env.get("id"):
            return str(env["id"]), dict(env.get("kwargs") or {})
    if manifest.get("env_id"):
        return str(manifest["env_id"]), {}
    raise RecordError(f"{run_dir}: neither config.yaml nor the policy manifest names the environment")


def _render(env: Any, env_id: str) -> np.ndarray:
    import gymnasium as gym

    try:
        frame = env.render()
    except gym.error.DependencyNotInstalled as err:
        raise RecordError(f"rendering {env_id} needs an extra package: {err} "
                          "(for the classic-control envs: pip install 'gymnasium[classic-control]', which "
                          "brings pygame)") from None
    if frame is None or np.asarray(frame).ndim != 3:
        raise RecordError(f"{env_id} returned no RGB frame from render() in rgb_array mode")
    return np.asarray(frame, np.uint8)


def _encode(frames: list[np.ndarray], suffix: str, fps: int) -> bytes:
    import imageio.v3 as iio

    if suffix == ".gif":
        # duration is per frame in milliseconds; loop=0 repeats forever.
        return iio.imwrite("<bytes>", np.stack(frames), extension=".gif", duration=1000 / fps, loop=0)
    try:
        return iio.imwrite("<bytes>", np.stack(frames), extension=".mp4", fps=fps, plugin="FFMPEG")
    except (ImportError, ValueError, RuntimeError) as err:
        raise RecordError(f"writing MP4 needs the imageio-ffmpeg package (pip install imageio-ffmpeg): {err}; "
                          "or write a .gif") from None


def record(run_dir: str | Path, out: str | Path = "agent.gif", episodes: int = 3, seed: int = 0,
           deterministic: bool = True, fps: int = 30, max_steps: int | None = None,
           frame_skip: int = 1) -> Recording:
    """Play `episodes` episodes with the run's latest exported policy and write them to `out`."""
    from rlstack.acting import load_policy
    from rlstack.envs import make_env

    run_dir, out = Path(run_dir), Path(out)
    if out.suffix.lower() not in FORMATS:
        raise RecordError(f"output '{out}' must end in one of {', '.join(FORMATS)}")
    for name, value, low in (("episodes", episodes, 1), ("fps", fps, 1), ("frame_skip", frame_skip, 1)):
        if value < low:
            raise RecordError(f"{name} must be >= {low}, got {value}")
    policy = load_policy(run_dir)
    env_id, kwargs = _env_settings(run_dir, policy.manifest)
    # rgb_array rendering draws off-screen; without this SDL (pygame) looks for a display and
    # complains about XDG_RUNTIME_DIR on headless machines. A value the user set wins.
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    env = make_env(env_id, kwargs, render_mode="rgb_array", training=False)
    rng = np.random.default_rng(seed)
    frames: list[np.ndarray] = []
    returns, lengths = [], []
    try:
        for episode in range(episodes):
            obs, _ = env.reset(seed=seed + episode)
            frames.append(_render(env, env_id))
            total, steps, done = 0.0, 0, False
            while not done and (max_steps is None or steps < max_steps):
                if isinstance(obs, dict):
                    raise RecordError(f"{env_id} observes a dict; record plays single-agent envs with array "
                                      "observations")
                action = policy.act(obs, deterministic=deterministic, rng=rng).action
                obs, reward, terminated, truncated, _ = env.step(action.item() if action.ndim == 0 else action)
                total += float(reward)
                steps += 1
                done = terminated or truncated
                if steps % frame_skip == 0 or done:
                    frames.append(_render(env, env_id))
            returns.append(total)
            lengths.append(steps)
    finally:
        env.close()
    from rlstack.fsutil import atomic_write_bytes

    atomic_write_bytes(out, _encode(frames, out.suffix.lower(), fps))
    return Recording(out, len(frames), returns, lengths)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlstack.record",
                                     description="Render a run's exported policy into a GIF or MP4.")
    parser.add_argument("run", help="run directory (or policy/ or a policy version directory)")
    parser.add_argument("--episodes", type=int, default=3)
    parser.add_argument("--out", default="agent.gif", help="output file, .gif or .mp4 (default agent.gif)")
    parser.add_argument("--seed", type=int, default=0, help="episode i resets the env with seed + i")
    parser.add_argument("--stochastic", action="store_true", help="sample actions instead of the deterministic one")
    parser.add_argument("--fps", type=int, default=30)
    parser.add_argument("--max-steps", type=int, default=None, help="cut each episode after this many steps")
    parser.add_argument("--frame-skip", type=int, default=1, help="keep every N-th frame (smaller files)")
    args = parser.parse_args(argv)

    try:
        rec = record(args.run, args.out, args.episodes, args.seed, not args.stochastic, args.fps, args.max_steps,
                     args.frame_skip)
    except RlstackError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {rec.path}: {rec.frames} frames, {len(rec.returns)} episode(s), returns "
          f"{', '.join(f'{r:.1f}' for r in rec.returns)} (lengths {', '.join(map(str, rec.lengths))})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
