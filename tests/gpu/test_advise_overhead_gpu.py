"""On a GPU: the seed scenario recorded, advised, then rerun with each cure ``advise`` names.

Each cure's bytes (``advise``) must be within 5 % of what ``cudaMemGetInfo`` shows the device
giving back when the cure is applied, and ``advise``'s verdict (the run fits through the
failing request) must equal the rerun's: it got more arrays than the recorded run did.
Needs a GPU with CuPy and NVML; takes about 20 s (four short runs).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tracekit.advise.candidates import Kind
from tracekit.advise.run import advise
from tracekit.trace import read_trace

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = ROOT / "scripts" / "seed_scenario.py"


def scenario(tmp_path: Path, name: str, *args: str, record: Path | None = None) -> dict[str, Any]:
    """One run of the scenario (recorded to ``record`` when given); its probe file."""
    probe = tmp_path / f"{name}.json"
    head = [sys.executable, "-m", "tracekit", "record", "-o", str(record)] if record else [sys.executable]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    run = subprocess.run([*head, str(SCENARIO), "--probe", str(probe), *args], capture_output=True, text=True,
                         timeout=120, env=env, cwd=ROOT)
    assert probe.exists(), run.stdout + run.stderr
    out: dict[str, Any] = json.loads(probe.read_text())
    return out


@pytest.mark.gpu
def test_seed_cures_on_the_device(tmp_path):
    trace = tmp_path / "seed.parquet"
    base = scenario(tmp_path, "base", record=trace)
    r = advise(read_trace(trace), jobs=1)
    assert r.room is not None and r.limit == base["mem_free"] + base["pool_total"]
    seen = {}
    for kind, flag in ((Kind.STACK_LIMIT, "stack"), (Kind.OTHER_PROCESS, "other-process")):
        o = next(x for x in r.room.tried if x.candidate.kind == kind)
        rerun = scenario(tmp_path, flag, "--cure", flag)
        gave_back = rerun["cure"]["returned"]
        seen[flag] = (o.candidate.returns, gave_back, o.fits, rerun["arrays"], base["arrays"])
        assert abs(o.candidate.returns - gave_back) <= 0.05 * gave_back, seen
        assert o.fits == (rerun["arrays"] > base["arrays"]), seen
    print(seen)
