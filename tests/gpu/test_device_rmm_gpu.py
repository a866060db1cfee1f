"""Device replay through RMM's real pool (``replay --device 0 --allocator rmm-pool``) on a GPU.

Marked ``gpu``; also skipped where RMM cannot be imported (its wheels are not a dependency: the
device machine gets them carried, ``scripts/gpu_torch_ends.sh``). The committed RMM logs of two real
programs (``traces/rmm-*.dev0.csv``) are imported and replayed at the maximum pool sizes that
``scripts/gpu_rmm_fidelity.py`` measured with RMM's ``PoolMemoryResource`` called directly
(``traces/fidelity/rmm.json``, initial pool 0): the verb must give the same first failing event and
the same peak pool size, and give back every byte.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIDELITY = json.loads((ROOT / "traces" / "fidelity" / "rmm.json").read_text())


def _rmm_reason() -> str | None:
    try:
        import rmm  # noqa: F401
    except Exception as e:
        return f"RMM is not importable ({type(e).__name__}: {e})"
    return None


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(_rmm_reason() is not None, reason=str(_rmm_reason()))]

POINTS = [(p["name"], q) for p in FIDELITY["programs"] for q in p["points"] if q["initial_bytes"] == 0]


def _tracekit(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tracekit", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=300)


@pytest.fixture(scope="module")
def traces(rmm_fidelity_traces: dict[str, Path]) -> dict[str, Path]:
    return rmm_fidelity_traces


@pytest.mark.parametrize(("program", "point"), POINTS,
                         ids=[f"{n}-{q['maximum_bytes']}" for n, q in POINTS])
def test_the_verb_replays_rmms_pool_as_rmm_did(traces: dict[str, Path], program: str,
                                               point: dict[str, int | None]) -> None:
    r = _tracekit("replay", str(traces[program]), "--device", "0", "--allocator", "rmm-pool",
                  "--capacity", str(point["maximum_bytes"]), "--json")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    oom = got["oom"]["seq"] if got.get("oom") else None
    assert oom == point["device_first_oom"]
    assert got["peak_reserved_bytes"] == point["device_peak_pool_bytes"]
    dev = got["device"]
    assert dev["free_end"] == dev["free_start"], "the replay kept device memory"


def test_advise_verifies_rmms_settings_on_rmms_own_pool(traces: dict[str, Path]) -> None:
    """``advise --verify-on-device 0`` on an RMM trace replays RMM's pool through RMM itself: the device
    says whether each of the three best settings fits, and agrees with the model on RMM's pool."""
    program = FIDELITY["programs"][0]
    point = next(q for q in program["points"] if q["initial_bytes"] == 0 and q["device_first_oom"] is None)
    r = _tracekit("advise", str(traces[program["name"]]), "--limit", str(point["maximum_bytes"]),
                  "--verify-on-device", "0", "--json", "--jobs", "1")
    assert r.returncode == 0, r.stderr
    checks = json.loads(r.stdout)["device_checks"]
    pool = [c for c in checks if c["setting"].startswith("RMM pool")]
    assert pool and all(c["fits_on_device"] is not None for c in pool), checks
    assert all(c["agrees"] for c in pool), checks
