"""The pytest plugin on a real GPU: the peaks it reports against witnesses inside the tests.

A child pytest runs a small test file under ``--gpu-memory``: CuPy tests whose own ``MemoryHook``
(CuPy's class, beside tracekit's hook) counts the live bytes and samples the pool's
``total_bytes()`` after every malloc, PyTorch tests that read ``max_memory_reserved`` and
``max_memory_allocated`` at their end, a CuPy test over a reserved budget (the message, the user's
line, advise's setting), one that leaks, and one that runs out of memory. Each witness writes its
figures to a JSON file; the plugin's figures come from the JUnit XML (``user_properties``)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
MiB = 1 << 20

INNER = '''
    import json, os
    import pytest
    import cupy
    import torch  # imported with the module, as test files do: the plugin measures both libraries

    MiB = 1 << 20
    OUT = os.environ["WITNESS_DIR"]


    def _cupy_witness():
        import cupy

        class Witness(cupy.cuda.MemoryHook):
            name = "witness"

            def __init__(self):
                pool = cupy.get_default_memory_pool()
                self.pool = pool
                self.live = self.peak = pool.used_bytes()
                self.reserved = pool.total_bytes()

            def malloc_postprocess(self, device_id, size, mem_size, mem_ptr, pmem_id):
                if mem_ptr:
                    self.live += mem_size
                    self.peak = max(self.peak, self.live)
                self.reserved = max(self.reserved, self.pool.total_bytes())

            def free_postprocess(self, device_id, mem_size, mem_ptr, pmem_id):
                self.live -= mem_size

        return Witness()


    def _save(name, **kw):
        with open(os.path.join(OUT, name + ".json"), "w") as f:
            json.dump(kw, f)


    def test_cupy_peak_mid_test():
        import cupy
        w = _cupy_witness()
        with w:
            a = [cupy.empty(3 * MiB + 1000 * k, dtype=cupy.uint8) for k in range(8)]
            del a[::2]
            b = cupy.ones((1500, 1500), dtype=cupy.float32)
            del a, b
            c = cupy.arange(5 * MiB, dtype=cupy.int8)
            del c
        _save("test_cupy_peak_mid_test", allocated=w.peak, reserved=w.reserved)


    def test_cupy_many_small():
        import cupy
        w = _cupy_witness()
        with w:
            keep = []
            for k in range(400):
                keep.append(cupy.empty(512 * (1 + k % 7), dtype=cupy.uint8))
                if k % 3 == 0:
                    keep.pop(0)
            del keep
        _save("test_cupy_many_small", allocated=w.peak, reserved=w.reserved)


    def test_torch_peaks():
        import torch
        x = [torch.empty(4 * MiB + 4096 * k, dtype=torch.uint8, device="cuda") for k in range(6)]
        del x[1:4]
        y = torch.randn(1024, 1024, device="cuda") @ torch.randn(1024, 1024, device="cuda")
        torch.cuda.synchronize()
        del x, y
        _save("test_torch_peaks", allocated=torch.cuda.max_memory_allocated(0),
              reserved=torch.cuda.max_memory_reserved(0))


    def make(n):
        import cupy
        return [cupy.empty(MiB, dtype=cupy.uint8) for _ in range(n)]


    @pytest.mark.limit_gpu_memory("8 MiB", metric="reserved")
    def test_cupy_over_budget():
        a = make(24)
        del a


    KEPT = []


    @pytest.mark.limit_gpu_leaks("1 MiB", warmups=1)
    def test_cupy_leaks():
        import cupy
        KEPT.append(cupy.empty(4 * MiB, dtype=cupy.uint8))


    def test_cupy_oom():
        import cupy
        cupy.empty(1 << 50, dtype=cupy.uint8)
'''


def _measured(xml: Path) -> dict[str, dict[str, object]]:
    """test name -> (its measurement: backend, devices; its failure text)."""
    out: dict[str, dict[str, object]] = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        got: dict[str, object] = {"failure": None}
        for prop in case.iter("property"):
            if prop.get("name") == "tracekit_gpu_memory":
                got["measured"] = ast.literal_eval(prop.get("value") or "{}")
        fail = case.find("failure")
        if fail is not None:
            got["failure"] = (fail.get("message") or "") + (fail.text or "")
        out[case.get("name") or ""] = got
    return out


def _peak(entry: dict[str, object], backend: str) -> dict[str, int]:
    measured = entry["measured"]
    assert isinstance(measured, dict)
    (m,) = [m for m in measured["measurements"] if m["backend"] == backend]
    (dev,) = [d for d in m["devices"] if d["device"] == 0]
    return {"allocated": int(dev["allocated"]), "reserved": int(dev["reserved"])}


def test_peaks_equal_the_witnesses_and_budgets_fail_with_the_diagnosis(tmp_path: Path) -> None:
    pytest.importorskip("cupy")
    pytest.importorskip("torch")
    (tmp_path / "test_inner.py").write_text(textwrap.dedent(INNER))
    witness = tmp_path / "witness"
    witness.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WITNESS_DIR": str(witness)}
    xml = tmp_path / "junit.xml"
    p = subprocess.run([sys.executable, "-m", "pytest", "-p", "tracekit.pytest.plugin",
                        "-p", "no:cacheprovider", "-q", "-rA", "--gpu-memory", f"--junitxml={xml}",
                        "test_inner.py"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    report = p.stdout + p.stderr
    got = _measured(xml)
    for name in ("test_cupy_peak_mid_test", "test_cupy_many_small", "test_torch_peaks"):
        assert got[name]["failure"] is None, report
        want = json.loads((witness / f"{name}.json").read_text())
        peak = _peak(got[name], "torch" if "torch" in name else "cupy")
        mine = (peak["allocated"], peak["reserved"])
        assert mine == (want["allocated"], want["reserved"]), (name, peak, want)
    over = str(got["test_cupy_over_budget"]["failure"])
    assert "GPU memory over budget: peak reserved 24.00 MiB on device 0 (cupy)" in over, over
    assert "test_inner.py" in over and "advise" in over
    leak = str(got["test_cupy_leaks"]["failure"])
    assert "4.00 MiB" in leak, leak
    oom = str(got["test_cupy_oom"]["failure"])
    assert "OutOfMemoryError" in oom and "tracekit" in oom, oom
    assert "highest" in report.lower() or "peak" in report.lower()  # the table at the end
