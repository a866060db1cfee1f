#!/usr/bin/env python3
"""A CuPy program's own pool that runs out at the limit the program set on it, on a real GPU: record
``scripts/pool_workloads.py user_pool_limit`` (its pool's ``set_limit`` read from
``USER_POOL_LIMIT_BYTES``, 48 MiB by default), ask ``tracekit advise`` (which should answer that
pool's question: ``pool`` in its JSON), then run the real program again with its pool's limit set to
what advise recommends, and to 1 MiB below the smallest capacity advise says gets through. The
witness is the program itself: its exit code and CuPy's own OutOfMemoryError message.

    PYTHONPATH=. python3 scripts/gpu_user_pool_limit.py OUT_DIR

Writes OUT_DIR/user-pool-limit.parquet, advise.json, advise.txt and summary.json.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

MiB = 1 << 20
PROGRAM = ["scripts/pool_workloads.py", "user_pool_limit"]


def run(cmd: list[str], env: dict[str, str] | None = None, timeout: int = 180) -> dict[str, object]:
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                       env={**os.environ, **(env or {})})
    tail = (p.stdout + p.stderr).strip().splitlines()[-3:]
    return {"cmd": cmd, "env": env or {}, "rc": p.returncode, "tail": tail}


def main() -> int:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    trace = out / "user-pool-limit.parquet"
    summary: dict[str, object] = {}
    summary["record"] = run([sys.executable, "-m", "tracekit", "record", "-o", str(trace), *PROGRAM])
    adv = subprocess.run([sys.executable, "-m", "tracekit", "advise", str(trace), "--json"],
                         capture_output=True, text=True, timeout=300)
    (out / "advise.json").write_text(adv.stdout)
    text = subprocess.run([sys.executable, "-m", "tracekit", "advise", str(trace)], capture_output=True,
                          text=True, timeout=300)
    (out / "advise.txt").write_text(text.stdout + text.stderr)
    doc = json.loads(adv.stdout)
    summary["pool"] = doc.get("pool")
    summary["limit_bytes"] = doc["limit_bytes"]
    summary["recommendation"] = doc["recommendation"]
    summary["min_capacity_bytes"] = doc["min_capacity_bytes"]
    fit = next((f for f in doc["fits"] if f["capacity_bytes"]), None)
    summary["fit"] = None if fit is None else {
        "setting": fit["setting"], "capacity_bytes": fit["capacity_bytes"], "line": fit["line"]}
    runs = {"as recorded": doc["limit_bytes"]}
    if fit is not None:
        runs["advised"] = fit["capacity_bytes"]
    if doc["min_capacity_bytes"]:
        runs["below the smallest that gets through"] = doc["min_capacity_bytes"] - MiB
    summary["runs"] = {name: {"limit_bytes": limit, **run([sys.executable, *PROGRAM],
                                                          {"USER_POOL_LIMIT_BYTES": str(limit)})}
                       for name, limit in runs.items()}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
