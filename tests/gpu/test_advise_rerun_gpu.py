"""``advise --rerun`` on a real GPU: a PyTorch program recorded under ``record --torch --limit``,
then run again for real under advise's best settings, beside PyTorch's own counters.

The program keeps a ring of 40 tensors whose sizes alternate between 5 and 7 MiB, freeing the
oldest, so under a cap a little above its live peak the caching allocator's cached blocks split
and the defaults run out; advise rates settings and ``--rerun 2`` runs the two best. Each rerun's
peak reserved (from its own trace) must equal ``torch.cuda.max_memory_reserved()`` of that run
(the program prints it), and a verdict of fits must hold for real.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROGRAM = """
    import torch
    ring = []
    for i in range(400):
        ring.append(torch.empty((5 if i % 2 else 7) << 20, dtype=torch.uint8, device="cuda"))
        if len(ring) > 40:
            ring.pop(0)
    big = torch.empty(300 << 20, dtype=torch.uint8, device="cuda")
    print("PEAK", torch.cuda.max_memory_reserved(), flush=True)
"""


def _torch_reason() -> str | None:
    try:
        import torch
    except Exception as e:
        return f"PyTorch is not importable ({type(e).__name__})"
    return None if torch.cuda.is_available() else "PyTorch sees no CUDA device"


pytestmark = [pytest.mark.gpu, pytest.mark.torch,
              pytest.mark.skipif(_torch_reason() is not None, reason=str(_torch_reason()))]


def _tk(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    return subprocess.run([sys.executable, "-m", "tracekit", *args], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=600)


def test_rerun_on_the_gpu_matches_pytorchs_counters(tmp_path: Path) -> None:
    (tmp_path / "ring.py").write_text(textwrap.dedent(PROGRAM))
    rec = _tk(tmp_path, "record", "--torch", "--limit", "560MiB", "-o", "t.parquet", "ring.py")
    assert "Wrote t.parquet" in rec.stderr, rec.stderr
    res = _tk(tmp_path, "advise", "t.parquet", "--json", "--rerun", "2")
    assert res.returncode == 0, res.stderr
    d = json.loads(res.stdout)
    ran = [r for r in d["reruns"] if r["ran"]]
    assert len(ran) == 2
    for r in ran:
        log = Path(r["trace"]).with_suffix(".log").read_text() if r["trace"] else ""
        if r["finished"]:
            peak = int(next(line.split()[1] for line in log.splitlines() if line.startswith("PEAK")))
            assert r["real_peak_reserved_bytes"] == peak, (r, log[-2000:])
        if r["predicted"] == "fits":
            assert r["got_past_failing_request"] is not False and r["agrees"] is not False, r
    print(json.dumps(d["reruns"], indent=1))
