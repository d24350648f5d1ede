"""`python -m rlstack.train`: train an agent from a YAML config plus dotted overrides."""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Callable
from pathlib import Path

from rlstack.config import DEFAULT_CONFIG, ConfigError, load_config
from rlstack.config_docs import describe
from rlstack.errors import RlstackError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m rlstack.train",
        description="Train PPO/DQN/SAC/TD3/AlphaZero on a gymnasium env. Overrides are dotted key=value pairs, "
                    "e.g. `seed=3 env.id=Acrobot-v1 train.total_steps=50000`.",
        epilog="Every config key with its default and meaning: --help-keys ppo (or dqn, sac, td3, alphazero).\n"
               "Options and overrides may come in any order.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", help="dotted key=value overrides")
    parser.add_argument("--config", default=None,
                        help=f"YAML config: a path, or a shipped config by name (default: {DEFAULT_CONFIG})")
    parser.add_argument("--out", default=None, help="run directory (default: runs/<algo>_<env>_s<seed>_<time>)")
    parser.add_argument("--resume", metavar="RUN_DIR", default=None,
                        help="continue the run in RUN_DIR from its latest checkpoint, or from one "
                             "checkpoint: RUN_DIR/checkpoints/step_N (overrides apply)")
    parser.add_argument("--help-keys", metavar="ALGO", default=None, help="list every config key for ALGO")
    parser.add_argument("--profile", action="store_true",
                        help="run MindSpore's Profiler over a window of updates; output in <out>/profile "
                             "and a printed table of the operators that took the most time")
    parser.add_argument("--profile-steps", type=_count(1), default=5, metavar="N",
                        help="updates recorded by --profile (default 5)")
    parser.add_argument("--profile-skip", type=_count(0), default=2, metavar="N",
                        help="updates run before recording starts, so compilation is left out (default 2)")
    return parser


def _count(minimum: int) -> Callable[[str], int]:
    """argparse type: an integer >= minimum, with a message naming the expected value."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got '{text}'") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {value}")
        return value
    return parse


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_intermixed_args(argv)  # options and overrides in any order
    if args.help_keys:  # like --help, without loading MindSpore
        try:
            print(describe(args.help_keys))
        except ConfigError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        return 0
    # Imported late: `--help` and `--help-keys` do not pay for loading MindSpore.
    from rlstack.trainer import Trainer, default_out_dir

    try:
        if args.resume:
            if args.config or args.out:
                raise ConfigError("--resume takes its config and directory from the run; drop --config/--out")
            trainer = Trainer.resume(args.resume, args.overrides)
        else:
            cfg = load_config(args.config, args.overrides)
            if cfg.learner.workers > 1:  # data-parallel learners (rlstack/launch.py)
                from rlstack import distributed, launch

                if distributed.role() is None:  # start the workers, each of them this command
                    out = Path(args.out) if args.out else default_out_dir(cfg)
                    return launch.launch(sys.argv[1:] if argv is None else argv, cfg, out)
                trainer = launch.worker_trainer(cfg, args.out)
            else:
                trainer = Trainer(cfg, args.out)
        print(f"run directory: {trainer.out}", flush=True)
        window = None
        if args.profile:
            from rlstack.profiling import ProfileWindow

            window = ProfileWindow(trainer.out / "profile", steps=args.profile_steps, skip=args.profile_skip)
            trainer.update_hooks.append(window.on_update)
        try:
            summary = trainer.train()
        finally:
            if window is not None:
                window.close()
        if trainer.world is not None:
            launch.finish(trainer, Path(args.out))
        if "stopped_by" in summary:  # SIGINT / SIGTERM: saved, then the conventional 128 + signal
            return 128 + int(signal.Signals[summary["stopped_by"]])
    except RlstackError as err:  # a refusal that says what to do: no traceback
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
