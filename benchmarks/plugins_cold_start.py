"""Cold start of `llmp plugins list`, against bare interpreter start-up in the same run.

    .venv/bin/python benchmarks/plugins_cold_start.py [--runs N]

Prints the median and best wall time of N runs of the installed `llmp`
console script, the same for `python -c pass` (the floor no CLI can beat),
their ratio, and whether torch, transformers or triton were imported.
Goal: under 0.5 s on a 2-core machine, with no heavy library imported.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

GOAL_SECONDS = 0.5


def wall_times(command: list[str], runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(command, check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    return times


def heavy_imports() -> list[str]:
    code = (
        "import sys\nfrom llmp.cli import main\n"
        "try:\n    main(['plugins', 'list', '--json'])\nexcept SystemExit:\n    pass\n"
        "print('HEAVY:' + ','.join(m for m in ('torch', 'transformers', 'triton') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    return [m for m in out.rsplit("HEAVY:", 1)[1].strip().split(",") if m]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    llmp = Path(sys.executable).with_name("llmp")
    wall_times([str(llmp), "plugins", "list", "--json"], 1)  # warm the page cache and stevedore's cache
    cli = wall_times([str(llmp), "plugins", "list", "--json"], args.runs)
    bare = wall_times([sys.executable, "-c", "pass"], args.runs)
    heavy = heavy_imports()
    median, floor = statistics.median(cli), statistics.median(bare)
    print(f"llmp plugins list --json: median {median:.3f} s, best {min(cli):.3f} s over {args.runs} runs")
    print(f"python -c pass          : median {floor:.3f} s, best {min(bare):.3f} s")
    print(
        f"ratio to bare interpreter: {median / floor:.1f}x; "
        f"goal {GOAL_SECONDS} s: {'met' if median < GOAL_SECONDS else 'MISSED'}"
    )
    print(f"heavy libraries imported: {', '.join(heavy) or 'none'}")
    return 0 if not heavy else 1


if __name__ == "__main__":
    sys.exit(main())
