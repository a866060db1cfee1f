"""While the program runs, the recorder opens and closes no file (its spool's descriptor is held).

A descriptor opened and closed in another thread while cuFFT makes a plan with JIT callbacks
makes that plan fail with CUFFT_INTERNAL_ERROR (measured on an H200:
``scripts/gpu_cufft_callback_probe.py``); the recorder's flusher writes every 0.5 s, so it must
not open anything. The program counts every ``os.open`` and ``open`` made in the process while it
allocates for over a second, through CuPy's stand-in.
"""

from __future__ import annotations

from pathlib import Path

from test_record_fake_cupy import _record  # the stand-in recording helpers (tests/cli on the path)

PROGRAM = """
    import builtins, io, os, threading, time
    import cupy
    calls = []
    real_os_open, real_open = os.open, builtins.open
    def counted_os_open(path, *a, **k):
        calls.append((threading.current_thread().name, str(path)))
        return real_os_open(path, *a, **k)
    def counted_open(file, *a, **k):
        calls.append((threading.current_thread().name, str(file)))
        return real_open(file, *a, **k)
    os.open, builtins.open, io.open = counted_os_open, counted_open, counted_open
    end = time.monotonic() + 1.6  # three flushes or more
    kept = []
    while time.monotonic() < end:
        kept.append(cupy.empty(4096))
        if len(kept) > 50:
            kept.clear()
        time.sleep(0.001)
    os.open, builtins.open, io.open = real_os_open, real_open, real_open
    print("opened", [c for c in calls if c[0] != "MainThread"])
"""


def test_the_flusher_opens_no_file_while_the_program_runs(tmp_path: Path) -> None:
    r = _record(tmp_path, PROGRAM, "-o", "t.parquet")
    assert r.returncode == 0, r.stderr
    assert "opened []" in r.stdout, r.stdout
    assert (tmp_path / "t.parquet").stat().st_size > 0
