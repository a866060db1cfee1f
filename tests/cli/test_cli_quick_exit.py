"""The console entry point ends without the interpreter's teardown only after tracekit's own code
(tracekit.cli.quick_exit), with every byte of output delivered and the verb's exit code."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tracekit.cli import quick_exit
from tracekit.cli.app import app

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "traces" / "cupy-oom-frag.parquet"


@pytest.fixture(autouse=True)
def _unmarked():
    quick_exit._STATE["skip"] = False
    yield
    quick_exit._STATE["skip"] = False


def _tracekit(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tracekit", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)


def test_a_quick_exit_delivers_all_output_and_the_code() -> None:
    p = _tracekit("analyze", str(TRACE), "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["oom"]["seq"] == 164  # the whole document arrived
    bad = _tracekit("analyze", str(ROOT / "traces" / "missing.parquet"))
    assert bad.returncode == 1 and bad.stderr.count("\n") == 1 and "missing.parquet" in bad.stderr


def test_a_closed_stdout_still_ends_with_the_verbs_code() -> None:
    # A daemon or cron job may start tracekit with descriptor 1 closed: Python's stdout is None.
    import os

    p = subprocess.run([sys.executable, "-m", "tracekit", "info", str(TRACE)], stderr=subprocess.PIPE,
                       text=True, cwd=ROOT, timeout=120, preexec_fn=lambda: os.close(1))
    assert p.returncode == 0, p.stderr


def test_verbs_of_tracekit_code_alone_mark_the_run() -> None:
    assert CliRunner().invoke(app, ["info", str(TRACE)]).exit_code == 0
    assert quick_exit._STATE["skip"]


def test_a_device_replay_keeps_the_normal_exit() -> None:
    # --device holds a GPU through CuPy, whose exit handlers must run (here it fails: no GPU or
    # no CuPy, or it runs; either way the run is not marked).
    CliRunner().invoke(app, ["replay", str(TRACE), "--device", "0"])
    assert not quick_exit._STATE["skip"]


def test_without_the_mark_nothing_ends() -> None:
    assert quick_exit.end_now_if_marked(0) is None  # still here


STUCK = """
import ctypes, signal, sys
from pathlib import Path
from tracekit import outputs
from tracekit.cli import quick_exit, watchdog
watchdog.GRACE_S = 0.5
quick_exit._STATE["console"] = lambda: False
signal.signal(signal.SIGTERM, lambda *a: sys.exit(143))  # the CLI's handler, which cannot run here
quick_exit.skip_teardown()
fd, tmp = outputs._open_temp(Path(sys.argv[1]), Path(sys.argv[1]).parent)
libc = ctypes.CDLL(None)
m = ctypes.create_string_buffer(64)
libc.pthread_mutex_init(m, None)
libc.pthread_mutex_lock(m)
print("stuck", flush=True)
libc.pthread_mutex_lock(m)  # never returns, signals or not (the GIL is released meanwhile)
"""


def test_a_signal_ends_a_run_stuck_in_native_code(tmp_path: Path) -> None:
    import signal
    import time

    p = subprocess.Popen([sys.executable, "-c", STUCK, str(tmp_path / "out.parquet")], cwd=ROOT,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "stuck"
    assert len(list(tmp_path.iterdir())) == 1  # the temporary output
    time.sleep(0.5)  # into the second lock: a signal before it would reach the Python handler
    t = time.monotonic()
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=30)
    assert p.returncode == 143 and time.monotonic() - t < 10, err
    assert err.strip().splitlines() == ["tracekit: terminated (SIGTERM)"], (p.returncode, err)
    assert list(tmp_path.iterdir()) == []  # nothing left behind
