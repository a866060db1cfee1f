"""Counterfactual runs of the PyTorch ``oom`` workload, and how well replay predicts them.

Two sub-commands:

``run --limit-bytes N``
    The program to record (on a GPU) with ``python -m tracekit record --torch``: the training
    loop of ``scripts/torch_workloads.py`` (same model, seeds and sequence schedule, growing
    sequences at the end) under ``set_per_process_memory_fraction(N / total)``, the limit of
    ``traces/torch-oom.parquet``. It turns no history on itself (the recorder does) and reads
    its allocator settings from ``PYTORCH_CUDA_ALLOC_CONF``, so each setting is one recording.
    It catches the out-of-memory error, prints it and exits 0.

``compare BASE.parquet RUN.parquet... [--hints all|invented|prepared|ordered] [--json]``
    Predicts each RUN from BASE (the default-settings recording) by replaying BASE under RUN's
    setting (``tracekit.advise.fidelity``) and prints the agreement table: reserved bytes
    after every request up to BASE's failing request.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def run(limit: int) -> int:
    import torch
    from torch_workloads import GROW, SCHEDULE, train  # scripts/ is first on sys.path

    _free, total = torch.cuda.mem_get_info(0)
    torch.cuda.set_per_process_memory_fraction(limit / total, 0)
    try:
        train(torch, SCHEDULE + GROW)
        print("no out-of-memory error", flush=True)
    except torch.cuda.OutOfMemoryError as e:
        print(f"oom: {e}", flush=True)
    return 0


def compare(base: Path, runs: list[Path], json_out: bool, hints: str) -> int:
    from tracekit.advise.fidelity import Hints, compare_runs

    table = compare_runs(base, runs, Hints(hints))
    if json_out:
        import json

        print(json.dumps(table.to_dict(), indent=1))
    else:
        print(table.to_markdown())
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--limit-bytes", type=int, required=True)
    c = sub.add_parser("compare")
    c.add_argument("base", type=Path)
    c.add_argument("runs", type=Path, nargs="+")
    c.add_argument("--json", action="store_true")
    c.add_argument("--hints", choices=["all", "invented", "prepared", "ordered"], default="ordered",
                   help="recorded hints the prediction uses (see tracekit.advise.fidelity.Hints)")
    a = p.parse_args()
    if a.cmd == "run":
        return run(a.limit_bytes)
    return compare(a.base, a.runs, a.json, a.hints)


if __name__ == "__main__":
    sys.exit(main())
