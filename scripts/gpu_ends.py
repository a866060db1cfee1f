"""On a GPU machine: every way a real CuPy program can end under ``tracekit record`` leaves a trace
holding every malloc made before the end, counted by the program's own CuPy ``MemoryHook``.

Each program allocates, counts its mallocs with a hook of its own (the witness, written to a file
after every step), then ends: normally, ``os._exit``, SIGKILL of itself, ``exec``, or SIGKILL from
outside in the middle of a step. A ``segments`` program checks the segment rows found without
replacing CuPy's ``_malloc`` against the pool's own ``total_bytes()``, and that probing freed
pointers leaves no CUDA error behind (``cudaPeekAtLastError``). Prints one JSON line per case.
    python3 scripts/gpu_ends.py WORKDIR
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

HEAD = """
    import ctypes, os, signal, sys
    import cupy
    class Witness(cupy.cuda.MemoryHook):
        name = "witness"
        def __init__(self):
            self.n = 0
        def malloc_postprocess(self, device_id, size, mem_size, mem_ptr, pmem_id):
            if mem_ptr:
                self.n += 1
    w = Witness()
    w.__enter__()
    def said(n=None):
        with open("witness.tmp", "w") as f:  # replaced whole: a kill never leaves it half written
            f.write(str(w.n if n is None else n))
        os.replace("witness.tmp", "witness.txt")
    def peek():
        for line in open("/proc/self/maps"):
            if "libcudart" in line:
                lib = ctypes.CDLL(line.split()[-1])
                return int(lib.cudaPeekAtLastError())
        return None
"""

BURST = """
    keep = [cupy.empty(1 << 20, dtype=cupy.uint8) for _ in range(50)]
    cupy.cuda.runtime.deviceSynchronize()
    said()
"""

PROGRAMS = {
    "exit": BURST,
    "os_exit": BURST + "    os._exit(0)\n",
    "sigkill_self": BURST + "    os.kill(os.getpid(), signal.SIGKILL)\n",
    "exec": BURST + "    os.execv('/bin/true', ['true'])\n",
    "killed_mid_step": """
    x = cupy.ones((512, 512), dtype=cupy.float32)
    step = 0
    while True:
        y = x @ x
        z = cupy.tanh(y) + x
        x = z / (1 + cupy.abs(z).max())
        cupy.cuda.runtime.deviceSynchronize()
        step += 1
        said()
""",
    "segments": """
    pool = cupy.cuda.MemoryPool()
    cupy.cuda.set_allocator(pool.malloc)
    a = [cupy.empty(3 << 20, dtype=cupy.uint8) for _ in range(4)]
    keep = a.pop()
    del a
    pool.free_all_blocks()          # three segments freed, no hook fires
    b = cupy.empty(5 << 20, dtype=cupy.uint8)   # the recorder probes before this one
    d = cupy.get_default_memory_pool()
    cupy.cuda.set_allocator(d.malloc)
    d.set_limit(size=16 << 20)
    c = cupy.empty(8 << 20, dtype=cupy.uint8)
    del c                            # cached in the default pool
    try:
        e = cupy.empty(12 << 20, dtype=cupy.uint8)  # CuPy frees the cached 8 MiB first, then fits
        f = cupy.empty(12 << 20, dtype=cupy.uint8)  # does not fit: retried, then OOM
    except cupy.cuda.memory.OutOfMemoryError:
        pass
    said()
    print(json.dumps({"user_total": pool.total_bytes(), "default_total": d.total_bytes(),
                      "peek": peek()}))
""",
}


def run(work: Path, name: str) -> dict[str, object]:
    folder = work / name
    folder.mkdir(parents=True, exist_ok=True)
    src = textwrap.dedent(HEAD) + textwrap.dedent(PROGRAMS[name])
    if name == "segments":
        src = "import json\n" + src
    (folder / "app.py").write_text(src)
    out = folder / "t.parquet"
    cmd = [sys.executable, "-m", "tracekit", "record", "-o", str(out), "app.py"]
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "PYTHONPATH": os.getcwd()})
    if name == "killed_mid_step":
        time.sleep(6.0)
        os.kill(p.pid, signal.SIGKILL)  # record runs the program in its own process
    stdout, stderr = p.communicate(timeout=120)
    for _ in range(100):  # the watcher finishes the trace in its own process
        if out.exists() and not (folder / "t.parquet.finishing").exists():
            break
        time.sleep(0.1)
    witness = folder / "witness.txt"
    row: dict[str, object] = {"case": name, "returncode": p.returncode,
                              "seconds": round(time.perf_counter() - t0, 2),
                              "witness_mallocs": int(witness.read_text() or 0) if witness.exists() else None,
                              "spool_left": (folder / "t.parquet.spool").exists(), "trace": out.exists(),
                              "stderr_tail": stderr[-300:]}
    if name == "segments":
        row["program"] = json.loads(stdout.strip().splitlines()[-1])
    if out.exists():
        from tracekit.trace import Op, read_trace

        t = read_trace(out, strict=True)
        ev = t.events
        row["trace_mallocs"] = int((ev.op == Op.MALLOC).sum())
        row["trace_ooms"] = int((ev.op == Op.OOM).sum())
        row["complete"] = t.meta.extra.get("complete")
        row["ended"] = t.meta.extra.get("ended")
        row["tail_rows"] = t.meta.extra.get("tail_rows")
        if name == "segments" and t.extras is not None:
            label = {e["id"]: e["label"] for e in t.meta.extra["pools"]}
            pool = t.extras.column("pool").to_pylist()
            wanted = (Op.SEGMENT_ALLOC, Op.SEGMENT_FREE, Op.OOM)
            seq = [(Op(int(o)).label, int(s), label.get(q, "?"))
                   for o, s, q in zip(ev.op, ev.size, pool, strict=True) if int(o) in wanted]
            row["segment_rows"] = seq
            live: dict[str, int] = {}
            for op, size, lab in seq:
                if op == "segment_alloc":
                    live[lab] = live.get(lab, 0) + size
                elif op == "segment_free":
                    live[lab] = live.get(lab, 0) - size
            row["trace_live_segment_bytes"] = live
    return row


def main() -> None:
    work = Path(sys.argv[1])
    for name in PROGRAMS:
        try:
            print(json.dumps(run(work, name)), flush=True)
        except Exception as e:  # one case's failure is a result, not the end of the run
            print(json.dumps({"case": name, "error": f"{type(e).__name__}: {e}"}), flush=True)


if __name__ == "__main__":
    main()
