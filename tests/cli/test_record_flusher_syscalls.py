"""The spool's own thread never maps, unmaps or protects memory, nor opens or closes a file,
while the program runs (``record.spool`` says why: cuFFT's JIT-callback plans fail beside a thread
that does). Watched with strace: every system call of that thread between its first and its last
periodic flush, while the main thread makes 300,000 events and garbage of its own."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHILD = textwrap.dedent("""
    import sys, time, types
    from pathlib import Path
    from tracekit.record.hook import EventBuffer, TraceHook
    from tracekit.record.sites import SiteTable
    from tracekit.record.spool import SpoolWriter
    from tracekit.trace import Source, TraceMeta
    buf, table = EventBuffer(), SiteTable(())
    s = types.SimpleNamespace(ptr=0)
    hook = TraceHook(buf, sites=table, current_stream=lambda: s)
    w = SpoolWriter(Path(sys.argv[1]), TraceMeta.new(Source.CUPY), buf, table, time.perf_counter_ns(),
                    interval=0.02, max_events=20000)
    w.start()
    print(w._thread.native_id, flush=True)
    garbage = []
    for n in range(300000):
        p = 0x7f0000000000 + n * 512
        hook.malloc_postprocess(device_id=0, size=512, mem_size=512, mem_ptr=p, pmem_id=n)
        garbage.append(bytearray(300))
        if n % 3 == 0:
            hook.free_postprocess(device_id=0, mem_size=512, mem_ptr=p, pmem_id=n)
        if n % 1000 == 0:
            garbage = []
            time.sleep(0.001)
    w.close()
    print(w.events, flush=True)
""")
WATCHED = {"mmap", "munmap", "mremap", "mprotect", "madvise", "brk", "openat", "open", "close"}


@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace (Debian: apt-get install strace)")
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux system calls")
def test_the_spool_thread_changes_no_mapping_and_opens_nothing_while_the_program_runs(tmp_path: Path) -> None:
    log = tmp_path / "trace.log"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run(
        ["strace", "-f", "-qq", "-o", str(log), "-e", "trace=%memory,openat,open,close,fsync",
         sys.executable, "-c", CHILD, str(tmp_path / "t.parquet.spool")],
        capture_output=True, text=True, env=env, timeout=300)
    if r.returncode != 0 and "ptrace" in r.stderr:
        pytest.skip(f"strace cannot trace here: {r.stderr.strip()[:200]}")
    assert r.returncode == 0, r.stderr
    tid, events = (int(x) for x in r.stdout.split())
    assert events == 400000  # 300,000 mallocs and 100,000 frees, every one written
    calls = [m.group(1) for line in log.read_text().splitlines()
             if (m := re.match(rf"{tid}\s+(\w+)\(", line))]
    flushes = [i for i, c in enumerate(calls) if c == "fsync"]
    assert len(flushes) >= 5, calls  # the flusher ran all along
    running = calls[flushes[0]:flushes[-1]]
    assert not [c for c in running if c in WATCHED], running
