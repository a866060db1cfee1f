"""On a GPU machine: when does CuPy's ``examples/cufft/callback/jit_r2c_c2r_string.py`` fail with
``CUFFT_INTERNAL_ERROR``, and is recording the cause?

The transparency suite saw that example fail intermittently under ``tracekit record`` (2 of 4
recorded runs) while its unrecorded runs passed; the suite runs ten programs at a time. This
probe separates the candidate causes, one condition at a time, each run in a fresh process:

1. ``plain`` / ``recorded`` alone, one after the other, with a warm callback cache (the cache
   of CuPy's LTO callbacks, ``CUPY_CACHE_DIR``) and with a fresh cache per run;
2. ``concurrent``: eight runs at once sharing one fresh cache, plain and recorded;
3. ``pressure``: plain runs while another process holds all but ``--leave`` bytes of the
   device (what a concurrent program of the suite can do to the device);
4. ``--variants``: the example with a warm cache under stand-ins for one part of the recorder
   each: through ``runpy`` alone, beside a thread that builds and fsyncs Arrow batches every
   50 ms (the spool's flusher), beside a thread that only wakes every 50 ms, and recorded with
   ``--no-sites``; every run's whole stderr is kept.

Each run's exit code and the last line of its stderr go to one JSON file.

    python3 scripts/gpu_cufft_callback_probe.py EXAMPLE.py --out $OUT/r2c.json [--repeats 6]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


WRAP = """
import os, runpy, sys, threading, time
mode, example = sys.argv[1], sys.argv[2]
import numpy as np, pyarrow as pa
PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"spool{os.getpid()}")
def batch():
    b = pa.RecordBatch.from_arrays([pa.array(np.arange(1000))], names=["a"])
    return b.serialize().to_pybytes()
def put(data, sync=True):
    fd = os.open(PATH, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.write(fd, data)
    if sync:
        os.fsync(fd)
    os.close(fd)
WORK = {
    "arrow-thread": lambda: put(batch()),
    "arrow-nosync-thread": lambda: put(batch(), False),
    "numpy-thread": lambda: put(np.arange(1000).tobytes()),
    "fsync-thread": lambda: put(b"x" * 8000),
    "idle-thread": lambda: None,
    "open-close-thread": lambda: os.close(os.open(PATH, os.O_RDONLY | os.O_CREAT, 0o644)),
    "held-fd-thread": lambda: (os.write(HELD, b"x" * 8000), os.fsync(HELD)),
    "cpu-thread": lambda: sum(range(20000)),
    "arrow-held-thread": lambda: os.write(HELD, batch()),
    "numpy-held-thread": lambda: os.write(HELD, np.array(list(range(8000)), np.int64).tobytes()),
    "mmap-thread": lambda: len(bytearray(8 << 20)),  # glibc maps and unmaps a block this large
}
HELD = os.open(PATH + "held", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
def loop(work):
    while True:
        work()
        time.sleep(0.05)
if mode in ("arrow-warm-thread", "arrow-held-warm-thread"):
    batch()  # every first use of Arrow's batch path done before the program starts
    mode = {"arrow-warm-thread": "arrow-thread", "arrow-held-warm-thread": "arrow-held-thread"}[mode]
if mode != "runpy":
    threading.Thread(target=loop, args=(WORK[mode],), daemon=True).start()
sys.argv = [example]
runpy.run_path(example, run_name="__main__")
"""


def one(example: str, recorded: bool | str, cache: str, work: str, keep: bool = False) -> dict[str, object]:
    env = {**os.environ, "CUPY_CACHE_DIR": cache, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, example]
    if recorded is True or recorded == "no-sites":
        extra = ["--no-sites"] if recorded == "no-sites" else []
        cmd = [sys.executable, "-m", "tracekit", "record", "--force", *extra, "-o",
               os.path.join(work, f"t{time.monotonic_ns()}.parquet"), example]
    elif isinstance(recorded, str):
        wrap = os.path.join(work, "wrap.py")
        Path(wrap).write_text(WRAP)
        cmd = [sys.executable, wrap, recorded, example]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=180)
    tail = [ln for ln in p.stderr.splitlines() if ln.strip()][-1:] or [""]
    out: dict[str, object] = {"recorded": recorded, "code": p.returncode,
                              "seconds": round(time.perf_counter() - t0, 2), "last_stderr": tail[0][-300:]}
    if keep or p.returncode != 0:
        out["stderr"] = p.stderr[-6000:]
    return out


def hold_all_but(leave: int) -> subprocess.Popen[str]:
    """A child process that takes every free byte of device 0 but ``leave`` and waits on stdin."""
    code = (
        "import cupy, sys\n"
        "free, _ = cupy.cuda.runtime.memGetInfo()\n"
        f"p = cupy.cuda.runtime.malloc(max(free - {leave}, 0))\n"
        "print('held', free - " + str(leave) + ", flush=True)\n"
        "sys.stdin.read()\n"
        "cupy.cuda.runtime.free(p)\n"
    )
    h = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True)
    assert h.stdout is not None
    h.stdout.readline()
    return h


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("example")
    ap.add_argument("--out", required=True)
    ap.add_argument("--repeats", type=int, default=6)
    ap.add_argument("--leave", type=int, default=64 << 20)
    ap.add_argument("--variants", action="store_true", help="only the stand-ins of step 4")
    ap.add_argument("--only", nargs="*", help="with --variants: these stand-ins (names as in WRAP's WORK, "
                    "'arrow-warm-thread', 'runpy', 'no-sites', 'True' = recorded, 'False' = plain)")
    a = ap.parse_args()
    example = os.path.abspath(a.example)
    res: dict[str, list[dict[str, object]]] = {}
    with tempfile.TemporaryDirectory() as work:
        warm = os.path.join(work, "warm-cache")
        if a.variants:
            one(example, False, warm, work)  # warms the cache
            for v in a.only or ("runpy", "idle-thread", "arrow-thread", "no-sites", "True", "False"):
                arg: bool | str = {"True": True, "False": False}.get(v, v)
                res[f"variant-{v}"] = [one(example, arg, warm, work) for _ in range(a.repeats)]
            write(a.out, res)
            return
        for rec in (False, True):
            res[f"alone-warm-{'rec' if rec else 'plain'}"] = [
                one(example, rec, warm, work) for _ in range(a.repeats)]
            res[f"alone-fresh-{'rec' if rec else 'plain'}"] = [
                one(example, rec, tempfile.mkdtemp(dir=work), work) for _ in range(a.repeats)]
        for rec in (False, True):
            shared = tempfile.mkdtemp(dir=work)
            with ThreadPoolExecutor(8) as ex:
                res[f"concurrent-fresh-{'rec' if rec else 'plain'}"] = list(
                    ex.map(one, [example] * 8, [rec] * 8, [shared] * 8, [work] * 8))
        h = hold_all_but(a.leave)
        try:
            res["pressure-plain"] = [one(example, False, warm, work) for _ in range(3)]
            res["pressure-rec"] = [one(example, True, warm, work) for _ in range(3)]
        finally:
            assert h.stdin is not None
            h.stdin.close()
            h.wait(timeout=30)
    write(a.out, res)


def write(out: str, res: dict[str, list[dict[str, object]]]) -> None:
    summary = {k: f"{sum(r['code'] != 0 for r in v)}/{len(v)} failed" for k, v in res.items()}
    Path(out).write_text(json.dumps({"summary": summary, "runs": res}, indent=1))
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
