"""``record --torch`` after the process is gone: the tracker's ring, finished by the watcher.

The C++ tracker (``tracekit/record/_torch_tracker.cpp``) runs only inside a PyTorch process on a
GPU (``tests/gpu/test_record_torch_ends_gpu.py``); here a process writes rows in the same layout
through the ring writer the tracker's layout comes from (``fastpath.Ring``, ``ROW_INTS`` wide),
starts the real watcher in its ``torch`` mode and dies by ``os._exit`` or SIGKILL, and the trace
must hold every event it wrote, with the actions, sizes and the OOM PyTorch's history would have
given, and nothing of the ring left. Worked answers: 1 segment of 20 MiB, 7 allocations of 1 MiB
(rounded 1 MiB), 3 frees, 1 OOM of 1 TiB with 123,456 bytes free.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from tracekit.record import torch_ring
from tracekit.trace import Op, read_trace

ROOT = Path(__file__).resolve().parents[2]
MiB = 1 << 20

CHILD = """
    import mmap, os, signal, sys
    from pathlib import Path
    from tracekit.record.fastpath import Ring, ring_bytes
    from tracekit.record import torch_ring as tr
    from tracekit.record.watch import Watched, Watcher

    out = Path(sys.argv[1])
    size = ring_bytes(64, tr.ROW_INTS)
    fd = os.open(tr.ring_path(out), os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    os.posix_fallocate(fd, 0, size)
    ring = Ring(mmap.mmap(fd, size, mmap.MAP_SHARED), tr.ROW_INTS)
    tr.write_head(out, {{"device": 0, "info": {{"command": "python app.py", "max_entries": 64}},
                        "launch": {{}}, "roots": [], "rerun": {{"argv": ["app.py"]}}}})
    w = Watcher.start(tr.ring_path(out), out, None, kind=Watched.TORCH_RING)
    assert w is not None
    t, S = 1_700_000_000_000_000, 0x7f0000000000
    ring.push(4, 0, S, 20 << 20, 0, t)  # segment_alloc
    for i in range(7):
        ring.push(1, 0, S + i * (2 << 20), 1 << 20, 0, t + 10 * i + 1)  # alloc
    for i in range(3):
        ring.push(2, 0, S + i * (2 << 20), 1 << 20, 0, t + 100 + 2 * i)  # free_requested
        ring.push(3, 0, S + i * (2 << 20), 1 << 20, 0, t + 101 + 2 * i)  # free_completed
    ring.push(8, 0, 0, 0, 0, t + 200)  # a snapshot: no row
    ring.push(9, 0, 123456, 1 << 40, 0, t + 201)  # oom: addr holds the free bytes
    print("written", flush=True)
    {end}
"""


def _run(tmp: Path, end: str) -> subprocess.CompletedProcess[str]:
    (tmp / "child.py").write_text(textwrap.dedent(CHILD.format(end=end)))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "child.py", str(tmp / "t.parquet")], cwd=tmp, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.watcher
@pytest.mark.parametrize(("end", "code"), [("os._exit(3)", 3), ("os.kill(os.getpid(), signal.SIGKILL)",
                                                                  -signal.SIGKILL)])
def test_the_watcher_writes_the_trace_from_the_ring(tmp_path: Path, end: str, code: int) -> None:
    p = _run(tmp_path, end)
    assert p.returncode == code, p.stderr
    assert "written" in p.stdout
    t = read_trace(tmp_path / "t.parquet", strict=True)  # waits for the watcher's mark
    ev = t.events
    assert int((ev.op == Op.SEGMENT_ALLOC).sum()) == 1
    assert int((ev.op == Op.MALLOC).sum()) == 7
    assert int((ev.op == Op.FREE).sum()) == 3
    assert set(ev.rounded[ev.op == Op.MALLOC].tolist()) == {MiB}
    oom = np.flatnonzero(ev.op == Op.OOM)
    assert len(oom) == 1 and int(ev.size[oom[0]]) == 1 << 40
    extra = t.meta.extra
    assert extra["finished_by"] == "watcher" and extra["complete"] is False
    assert extra["torch_ring"] == {"rows": 16, "missing": 0, "frames": False}
    assert extra["rerun"] == {"argv": ["app.py"]}
    left = sorted(x.name for x in tmp_path.iterdir())
    assert left == ["child.py", "t.parquet"], left  # no ring, no head, no mark


def test_a_lapped_ring_keeps_its_last_rows(tmp_path: Path) -> None:
    """A ring that wrapped keeps the newest rows and says how many it lost; the trace still reads."""
    import mmap

    from tracekit.record.fastpath import Ring, ring_bytes
    from tracekit.record.torch_trace import finish_from_ring

    out = tmp_path / "t.parquet"
    size = ring_bytes(16, torch_ring.ROW_INTS)
    fd = os.open(torch_ring.ring_path(out), os.O_RDWR | os.O_CREAT, 0o644)
    os.posix_fallocate(fd, 0, size)
    ring = Ring(mmap.mmap(fd, size, mmap.MAP_SHARED), torch_ring.ROW_INTS)
    S = 0x7f0000000000
    ring.push(4, 0, S, 20 << 20, 0, 1)
    for i in range(20):
        ring.push(1, 0, S, MiB, 0, 10 * i + 2)
        ring.push(3, 0, S, MiB, 0, 10 * i + 3)
    read = torch_ring.read_rows(torch_ring.ring_path(out))
    assert read is not None and len(read.rows) == 16 and read.missing == 41 - 16
    assert read.rows[-1].tolist() == [3, 0, S, MiB, 0, 193]
    path = finish_from_ring(torch_ring.ring_path(out), out, {})
    assert path == out
    t = read_trace(out, strict=True)
    assert t.meta.extra["torch_ring"]["missing"] == 25
    assert int((t.events.op == Op.MALLOC).sum()) >= 8
    os.close(fd)


def test_not_a_ring_gives_no_trace(tmp_path: Path) -> None:
    from tracekit.record.torch_trace import finish_from_ring

    bad = tmp_path / "t.parquet.torchring"
    bad.write_bytes(b"\0" * 4096)
    assert torch_ring.read_rows(bad) is None
    assert finish_from_ring(bad, tmp_path / "t.parquet", {}) is None
    assert not (tmp_path / "t.parquet").exists()


def test_the_tracker_that_cannot_be_built_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without PyTorch (this machine) the build child fails and the reason names it; nothing is left."""
    try:
        import torch  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("PyTorch is installed here: the build would run (tests/gpu covers it)")
    monkeypatch.setattr(torch_ring, "library_path", lambda d, v: tmp_path / "tracker.so")
    lib, why = torch_ring.build(str(tmp_path), "0.0")
    assert lib is None and why is not None and "torch" in why
    assert list(tmp_path.iterdir()) == []
