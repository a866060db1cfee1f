"""A signal while ``whatif`` and ``advise`` replay on their threads (``workers.Pool.map``):
the command ends at once with the signal's exit code and one line, whatever the threads were doing
(a thread's running kernel is not waited for)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _default_signals() -> None:
    """In the child: Ctrl-C as in a terminal, even when this test runs as a background job
    (a shell starts those with SIGINT ignored, and Python keeps an inherited SIG_IGN)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("threads") / "t.parquet"
    subprocess.run([sys.executable, "-m", "tracekit", "synth", "-p", "fragmenting", "-n", "4000000",
                    "--seed", "3", "-o", str(out)], check=True, cwd=ROOT, capture_output=True,
                   env={**os.environ, "PYTHONPATH": str(ROOT)})
    return out


@pytest.mark.parametrize(("verb", "sig", "code", "after_s"), [
    ("whatif", signal.SIGINT, 130, 1.5), ("whatif", signal.SIGTERM, 143, 2.5),
    ("advise", signal.SIGINT, 130, 2.0)])
def test_a_signal_ends_a_threaded_search_at_once(big: Path, verb: str, sig: int, code: int,
                                                 after_s: float) -> None:
    extra = ["--policies", "best-fit,first-fit,worst-fit"] if verb == "whatif" else ["--limit", "64MiB"]
    p = subprocess.Popen([sys.executable, "-m", "tracekit", verb, str(big), "--jobs", "2", "--json", *extra],
                         cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, preexec_fn=_default_signals)
    time.sleep(after_s)
    if p.poll() is not None:
        pytest.fail(f"{verb} ended before the signal ({p.returncode}): make the trace longer")
    p.send_signal(sig)
    sent = time.monotonic()
    try:
        _, err = p.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()
        pytest.fail(f"{verb} still ran 30 s after the signal")
    assert p.returncode == code, err
    assert time.monotonic() - sent < 5, "the command waited for its threads' kernels"
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
