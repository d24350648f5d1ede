"""`python -m rlstack.bench <name> [options]`; `python -m rlstack.bench --help` lists the names."""

from __future__ import annotations

import sys

from rlstack.bench import BENCHMARKS, run


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print(f"usage: python -m rlstack.bench {{{','.join(sorted(BENCHMARKS))}}} [options]")
        return 0
    return run(sys.argv[1], sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
