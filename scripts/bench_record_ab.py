"""Recording overhead of this tree against an earlier one, on the same machine in the same minutes.

``bench_record_overhead.py`` runs in fresh processes, alternately with this tree's ``tracekit`` and
with the one under ``--base`` (say ``git archive COMMIT tracekit scripts | tar -x -C base``), each
process interleaving its own variants; a process's ratios to CuPy's no-op hook are its own (the
machine's speed drifts between processes, so only ratios measured side by side are compared). The
result is the median over rounds of each tree's ratios, and the per-round figures.

    PYTHONPATH=. python3 scripts/bench_record_ab.py --base BASE_DIR [--rounds 4] [--repeats 5] --json OUT
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
VARIANTS = ("record_no_sites", "record_sites", "record_stacks")


def one(tree: Path, steps: int, repeats: int) -> dict[str, float]:
    """One process of ``bench_record_overhead.py`` against ``tree``: its ratios to the no-op hook
    (min over its repeats), of process CPU seconds to no hook, and the share of the loop's seconds
    its own threads spent writing the spool (0 where another thread writes it)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        env = {**os.environ, "PYTHONPATH": str(tree)}
        subprocess.run([sys.executable, str(HERE / "bench_record_overhead.py"), "--steps", str(steps),
                        "--repeats", str(repeats), "--json", str(out)], env=env, check=True,
                       stdout=subprocess.DEVNULL)
        r = json.loads(out.read_text())
    got = {f"{v}_to_noop": r["ratio_to_noop"][v] for v in VARIANTS}
    got |= {f"{v}_cpu": r["cpu_ratio"][v] for v in VARIANTS}
    got["stacks_to_sites"] = r["ratio_stacks_to_sites"]
    # the program thread's spool writes (warm-up and timed loop) against the timed loop's seconds
    trims = r.get("trim_s_median", {})
    got |= {f"{v}_trim_share": trims.get(v, 0.0) / r["seconds_median"][v] for v in VARIANTS}
    return got


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    trees = {"base": args.base.resolve(), "this": HERE.parent}
    rounds: dict[str, list[dict[str, float]]] = {k: [] for k in trees}
    for i in range(args.rounds):
        order = list(trees) if i % 2 == 0 else list(reversed(trees))  # neither always goes first
        for name in order:
            rounds[name].append(one(trees[name], args.steps, args.repeats))
            print(name, i, json.dumps(rounds[name][-1]), flush=True)
    median = {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in rounds.items()}
    result = {"base": str(args.base), "rounds": rounds, "median": median}
    print(json.dumps(median, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
