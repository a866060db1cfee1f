"""``report --advise`` and ``advise --verify-on-device``, on the real CuPy fragmentation trace."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tracekit.advise.candidates import Kind
from tracekit.advise.on_device import verify
from tracekit.advise.run import advise
from tracekit.cli.app import app
from tracekit.trace import read_trace

FRAG = Path(__file__).resolve().parents[2] / "traces" / "cupy-oom-frag.parquet"


def test_report_advise_adds_the_chart_and_the_table(tmp_path):
    out, png = tmp_path / "r.html", tmp_path / "png"
    r = CliRunner().invoke(app, ["report", str(FRAG), "-o", str(out), "--advise", "--png", str(png)])
    assert r.exit_code == 0, r.output
    page = out.read_text()
    assert '"title":"Advise: settings that fit under the limit"' in page  # the page's data model
    assert '"answer":{"recommendation":' in page and "free_all_blocks()" in page
    assert "verified through the failing request; the run past it was not recorded" in page
    assert (png / "advise.png").stat().st_size > 10_000


def test_report_advise_png_reads_the_trace_once_and_advises_once(tmp_path, monkeypatch):
    """The page and the figures are drawn from one reading, one analysis and one advise."""
    import tracekit.advise.run as run
    import tracekit.analysis
    import tracekit.report.page as page

    counts = {"read": 0, "analyze": 0, "advise": 0}

    def counted(name, real):
        def f(*a, **k):
            counts[name] += 1
            return real(*a, **k)
        return f

    monkeypatch.setattr(page, "read_trace", counted("read", page.read_trace))
    analyze = tracekit.analysis.analyze_trace
    monkeypatch.setattr(tracekit.analysis, "analyze_trace", counted("analyze", analyze))
    monkeypatch.setattr(run, "advise", counted("advise", run.advise))
    out, png = tmp_path / "r.html", tmp_path / "png"
    r = CliRunner().invoke(app, ["report", str(FRAG), "-o", str(out), "--advise", "--png", str(png)])
    assert r.exit_code == 0, r.output
    assert counts == {"read": 1, "analyze": 1, "advise": 1}
    assert (png / "advise.png").is_file() and (png / "timeline.png").is_file()


def test_verify_on_device_reports_what_it_could_not_check():
    """A change the device replay cannot make is not claimed either way."""
    t = read_trace(FRAG)
    res = advise(t, jobs=1)
    release = [o for o in res.fits if o.candidate.kind == Kind.CUPY_RELEASE]
    (check,) = verify(t, release, 0)
    assert check.fits_on_device is None and check.agrees is None and "cannot insert" in check.note


def test_verify_on_device_without_a_gpu_is_an_error():
    try:
        import cupy  # noqa: F401
        pytest.skip("CuPy is importable here: the device may be usable")
    except ImportError:
        pass
    cmd = [sys.executable, "-m", "tracekit", "advise", str(FRAG), "-j", "1", "--verify-on-device", "0"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 1 and "--verify-on-device 0" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.gpu
def test_verify_on_device_checks_the_device_allocator_model():
    """cudaMalloc and the raised set_limit fit on the real device where CuPy's pool ran out at 256 MiB.

    MemoryAsyncPool is checked too; on the H200 its own pool fragmented on this trace
    (docs/fidelity.md), which the check reports as a disagreement with the model.
    """
    t = read_trace(FRAG)
    res = advise(t, jobs=1)
    picked = [o for o in res.fits if o.candidate.kind in (Kind.CUDA_MALLOC, Kind.CUPY_LIMIT, Kind.CUPY_ASYNC)]
    checks = {c.setting: c for c in verify(t, picked, 0, top=len(picked))}
    print({k: (c.fits_on_device, c.peak_reserved_on_device, c.note) for k, c in checks.items()})
    for o in picked:
        c = checks[o.label()]
        assert c.fits_on_device is not None, c.note
        if o.candidate.kind != Kind.CUPY_ASYNC:
            assert c.fits_on_device and c.agrees


@pytest.mark.gpu
def test_verify_on_device_confirms_the_torch_settings():
    """The top PyTorch settings for torch-oom, replayed through PyTorch's own allocator, fit too."""
    pytest.importorskip("torch")
    t = read_trace(FRAG.parent / "torch-oom.parquet")
    res = advise(t, jobs=1)
    checks = verify(t, res.fits, 0)
    print([c.to_dict() for c in checks])
    assert len(checks) == 3
    for c in checks:
        assert c.fits_on_device is True and c.agrees, c


def test_report_advise_on_a_trace_without_a_limit_says_why(tmp_path):
    src, out = tmp_path / "raw.parquet", tmp_path / "raw.html"
    r = CliRunner().invoke(app, ["synth", "--pattern", "random", "--events", "2000", "-o", str(src)])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(app, ["report", str(src), "-o", str(out), "--advise"])
    assert r.exit_code == 0, r.output
    assert "Not run:" in out.read_text() and "--limit" in out.read_text()
