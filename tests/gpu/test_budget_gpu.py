"""The budget measured on a real GPU, in a fresh process so 'before the context' is really before.

Marked ``gpu``. The terms must add up to the board total within the 2 MiB
granularity, NVML and CUDA must agree on the totals and the context cost,
and the probes must report what the device really did.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]
MiB = 1 << 20


def _budget(*args: str) -> dict:
    p = subprocess.run([sys.executable, "-m", "tracekit", "budget", "--json", *args],
                       capture_output=True, text=True, cwd=ROOT, timeout=240)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


@pytest.fixture(scope="module")
def cheap() -> dict:
    return _budget()


def test_cheap_budget_in_this_process_has_every_key() -> None:
    from tracekit.budget import BUDGET_KEYS, cheap_budget

    b = cheap_budget(0)
    assert set(BUDGET_KEYS) <= set(b)
    json.dumps(b)  # JSON-able as stored in trace metadata
    assert b["cuda_total"] > b["cuda_free"] > 0
    assert b["stack_size"] > 0 and b["sm_count"] > 0
    assert b["local_memory_model_bytes"] == b["stack_size"] * b["max_threads_per_sm"] * b["sm_count"]


def test_terms_add_up_to_the_total_within_2_mib(cheap: dict) -> None:
    un = next(t for t in cheap["terms"] if t["name"] == "unaccounted")
    assert abs(un["bytes"]) <= 2 * MiB
    assert all(c["ok"] for c in cheap["checks"]), cheap["checks"]
    assert cheap["context_existed"] is False
    assert cheap["context_bytes"] > 0


def test_kernel_local_memory_is_taken_at_launch_and_kept() -> None:
    b = _budget("--kernel-local-bytes", "16384")
    kl = b["kernel_local"]
    assert kl["local_size_bytes"] >= 16384
    assert kl["stack_size_after"] >= 16384 > kl["stack_size_before"]
    # the seed's model (local bytes x threads/SM x SMs) bounds what the launch takes
    assert 0.5 * kl["model_bytes"] <= kl["launch_bytes"] <= 1.05 * kl["model_bytes"]
    assert kl["kept_bytes"] >= kl["launch_bytes"]
    un = next(t for t in b["terms"] if t["name"] == "unaccounted")
    assert abs(un["bytes"]) <= 2 * MiB


def test_largest_allocation_is_almost_all_free_memory() -> None:
    b = _budget("--probe-largest")
    lg = b["probe"]["largest"]
    assert lg["largest"] <= lg["free"] + 2 * MiB
    assert lg["fraction"] > 0.99
    assert lg["free_after"] == lg["free"]  # every probe allocation was freed
    big = next(g for g in b["probe"]["granularity"] if g["request"] == 2 * MiB + 1)
    assert big["per_allocation"] % (2 * MiB) == 0
