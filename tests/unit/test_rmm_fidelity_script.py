"""``scripts/gpu_rmm_fidelity.py`` without a GPU: its search and its plumbing (``--dry-run``)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def _script() -> ModuleType:
    path = ROOT / "scripts" / "gpu_rmm_fidelity.py"
    spec = importlib.util.spec_from_file_location("gpu_rmm_fidelity", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_bisect_and_scan_find_the_smallest_size() -> None:
    m = _script()
    calls: list[int] = []

    def fits(c: int) -> bool:
        calls.append(c)
        return c >= 37

    assert m.bisect(fits, 5, 2) == (38, len(calls))
    # Fitting from 20 to 24, then again from 30 on: bisection may land on either stretch, the scan
    # names the first and says fitting was not monotone.
    assert m.scan(lambda c: 20 <= c <= 24 or c >= 30, 10, 40, 2) == (20, False, 2)
    assert m.scan(lambda c: c >= 30, 10, 40, 2) == (30, True, 2)
    assert m.scan(lambda c: False, 10, 40, 2)[0] is None


def test_dry_run_writes_the_results(tmp_path: Path) -> None:
    m = _script()
    assert m.main(["--dry-run", "--out", str(tmp_path), "--programs", "cupy"]) == 0
    res = json.loads((tmp_path / "rmm_fidelity.json").read_text())
    (prog,) = res["programs"]
    assert res["dry_run"] and prog["name"] == "cupy" and prog["events"] == 4000
    assert (tmp_path / prog["trace"]).exists() and (tmp_path / prog["log"]).exists()
    b = prog["bisect"]
    assert prog["peak_live_bytes"] <= b["model_scanned_bytes"] <= b["model_bytes"]
    lowest = prog["points"][0]  # the maximum at the peak of live bytes, no initial pool
    assert lowest["maximum_bytes"] <= prog["peak_live_bytes"] and lowest["device_first_oom"] is None
    assert all(p["model_peak_pool_bytes"] < p["maximum_bytes"] + 256 for p in prog["points"])
