"""The recorder's transparency suite on a GPU: every program runs as itself and under ``record``.

Each program runs twice, ``python3 PROG ARGS`` and ``python3 -m tracekit record [--torch] -o
T.parquet PROG ARGS``, each from a copy of its folder, with the same witness in the program's
own process: ``sitecustomize.py`` from a folder this script writes (on ``PYTHONPATH``), which
registers an independent ``cupy.cuda.MemoryHook`` in the main thread and every thread started
later (as CuPy's ``LineProfileHook`` would be used) and, for PyTorch programs, keeps
``torch.cuda.memory_stats()``; at exit it writes what it saw. Per program the result says:

- ``exit_same``, ``stdout_same``, ``stderr_same``: equal between the two runs (stderr without
  tracekit's own lines, both with the program's folder written as ``<dir>``); ``*_masked``:
  equal once every decimal number is masked (timings an example prints differ between any two
  runs, recorded or not);
- for CuPy: ``mallocs_equal``: the trace's malloc rows of the pools hooks see (every pool but a
  ``MemoryAsyncPool``) are the witness's mallocs, as (address, size) multisets; ``frees_in_witness``:
  every free row of the trace is one the witness saw (the witness also sees the frees after the
  recording ended, when the program's globals are released: ``frees_after``); ``ooms_equal``;
  ``segments_equal`` (the witness's ``alloc_postprocess`` against the trace's ``segment_alloc``);
  ``program_same``: the witness saw the same allocation sizes with and without recording;
- for PyTorch: ``mallocs_equal`` (trace mallocs = ``allocation.all.allocated``), ``frees_le``
  and ``program_same`` (the witness's counters equal with and without recording).

CuPy's examples come from its source repository (``--examples``, not committed); the other
programs are written here (``OWN``), one per lazily imported compiled module and one per
misbehaviour the recorder must survive.

    PYTHONPATH=. python3 scripts/gpu_transparency.py OUT_DIR --examples EXAMPLES [--jobs 6]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

# (name, path under examples/, arguments): every example that runs on one GPU, defaults kept
# except where a default takes minutes; multi-GPU and MPI examples are left out.
# cg/cg.py is left out: it ran past 150 s on the H200, with or without recording (2026-12-02).
EXAMPLES: list[tuple[str, str, list[str]]] = [
    ("ex-cufft-callback-jit", "cufft/callback/jit_string.py", []),
    ("ex-cufft-callback-jit2", "cufft/callback/jit_string2.py", []),
    ("ex-cufft-callback-r2c", "cufft/callback/jit_r2c_c2r_string.py", []),
    ("ex-cufft-callback-legacy", "cufft/callback/legacy.py", []),
    ("ex-cusparselt", "cusparselt/matmul.py", []),
    ("ex-struct-vectors", "custom_struct/builtin_vectors.py", []),
    ("ex-struct-complex", "custom_struct/complex_struct.py", []),
    ("ex-struct-packed", "custom_struct/packed_matrix.py", []),
    ("ex-cutensor-contraction", "cutensor/contraction.py", []),
    ("ex-cutensor-binary", "cutensor/elementwise_binary.py", []),
    ("ex-cutensor-trinary", "cutensor/elementwise_trinary.py", []),
    ("ex-cutensor-reduction", "cutensor/reduction.py", []),
    ("ex-black-scholes", "finance/black_scholes.py", []),
    ("ex-monte-carlo", "finance/monte_carlo.py", ["--n-threads-per-option", "10000"]),
    ("ex-sgemm", "gemm/sgemm.py", []),
    ("ex-gmm", "gmm/gmm.py", []),
    ("ex-jit-elementwise", "jit/elmentwise_op.py", []),
    ("ex-jit-reduction-atomic", "jit/reduction_atomic.py", []),
    ("ex-jit-reduction-simple", "jit/reduction_simple.py", []),
    ("ex-kmeans", "kmeans/kmeans.py", []),
    ("ex-kmeans-kernel", "kmeans/kmeans.py", ["--use-custom-kernel"]),
    ("ex-peer-matrix", "peer/peer_matrix.py", []),
    ("ex-stream-cublas", "stream/cublas.py", []),
    ("ex-stream-cufft", "stream/cufft.py", []),
    ("ex-stream-event", "stream/cupy_event.py", []),
    ("ex-stream-kernel", "stream/cupy_kernel.py", []),
    ("ex-stream-memcpy", "stream/cupy_memcpy.py", []),
    ("ex-stream-curand", "stream/curand.py", []),
    ("ex-stream-cusolver", "stream/cusolver.py", []),
    ("ex-stream-cusparse", "stream/cusparse.py", []),
    ("ex-stream-map-reduce", "stream/map_reduce.py", []),
    ("ex-stream-thrust", "stream/thrust.py", []),
]

LONG = ("ex-kmeans", "ex-kmeans-kernel", "ex-gmm", "sparse", "torch-resnet", "torch-gpt2-config",
        "torch-own-history", "ex-black-scholes", "ndimage", "svd-solve")

OWN: dict[str, str] = {
    "eigh": """
        import cupy as cp
        rs = cp.random.RandomState(0)
        a = rs.standard_normal((256, 256)); a = a + a.T
        w, v = cp.linalg.eigh(a)
        print("eigh", round(float(w.sum()), 3), v.shape)
        print("eigvalsh", round(float(cp.linalg.eigvalsh(a).max()), 3))
    """,
    "svd-solve": """
        import cupy as cp
        rs = cp.random.RandomState(1)
        x = rs.standard_normal((300, 200))
        s = cp.linalg.svd(x, compute_uv=False)
        print("svd", round(float(s.sum()), 3))
        b = rs.standard_normal((200, 200)) + 200 * cp.eye(200)
        y = rs.standard_normal(200)
        z = cp.linalg.solve(b, y)
        print("solve", bool(cp.abs(b @ z - y).max() < 1e-8))
        q, r = cp.linalg.qr(x)
        sol = cp.linalg.lstsq(x, rs.standard_normal(300), rcond=None)[0]
        print("qr", q.shape, r.shape, "lstsq", sol.shape)
    """,
    "fft-plan-cache": """
        import cupy as cp
        cache = cp.fft.config.get_plan_cache()
        cache.set_size(3)
        for n in (256, 512, 1000, 4096, 256, 777):
            y = cp.fft.fft(cp.arange(n, dtype=cp.complex64))
        print("fft", round(float(abs(y).sum()), 1), "cached", cache.get_curr_size())
        print("fft2", cp.fft.fft2(cp.ones((64, 64))).shape, "rfft", cp.fft.rfft(cp.ones(1000)).shape)
        cache.clear()
        print("cleared", cache.get_curr_size())
    """,
    "sort": """
        import cupy as cp
        x = cp.random.RandomState(2).standard_normal(1 << 20)
        s = cp.sort(x)
        i = cp.argsort(x)
        print("sorted", bool((s[1:] >= s[:-1]).all()), bool((x[i] == s).all()))
        keys = cp.random.RandomState(3).randint(0, 10, (2, 1000))
        print("lexsort", cp.lexsort(keys).shape, "unique", int(cp.unique(keys).size))
    """,
    "cub": """
        import cupy as cp
        from cupy import _core
        _core.set_routine_accelerators(["cub"])
        _core.set_reduction_accelerators(["cub"])
        x = cp.arange(1 << 22, dtype=cp.float64)
        print("sum", float(x.sum()), "max", float(x.max()), "argmax", int(x.argmax()))
        print("cumsum", float(cp.cumsum(x)[-1]))
    """,
    "sparse": """
        import cupy as cp
        import cupyx.scipy.sparse as sp
        import cupyx.scipy.sparse.linalg as spl
        m = sp.random(1000, 1000, density=0.01, format="csr", random_state=0, dtype=cp.float64)
        a = (m @ m.T + sp.identity(1000, format="csr") * 10).tocsr()
        b = cp.ones(1000)
        x, info = spl.cg(a, b)
        print("cg", info, bool(cp.abs(a @ x - b).max() < 1e-3), "nnz", int(a.nnz))
        print("spsolve", bool(cp.abs(a @ spl.spsolve(a, b) - b).max() < 1e-6))
    """,
    "ndimage": """
        import cupy as cp
        from cupyx.scipy import ndimage
        img = cp.random.RandomState(4).random_sample((256, 256))
        g = ndimage.gaussian_filter(img, 2)
        labels, n = ndimage.label(g > 0.5)
        print("gauss", round(float(g.sum()), 2), "labels", int(n), "zoom", ndimage.zoom(img, 0.5).shape)
    """,
    "rawmodule": r"""
        import cupy as cp
        src = '''extern "C" __global__ void axpy(float a, const float* x, float* y, int n) {
            int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) y[i] += a * x[i]; }'''
        mod = cp.RawModule(code=src)
        k = mod.get_function("axpy")
        n = 1 << 20
        x = cp.ones(n, dtype=cp.float32); y = cp.zeros(n, dtype=cp.float32)
        k(((n + 255) // 256,), (256,), (cp.float32(2.0), x, y, cp.int32(n)))
        print("axpy", float(y.sum()))
    """,
    "pool-subclass": """
        import cupy as cp

        class CountingPool(cp.cuda.MemoryPool):
            def malloc(self, size):
                self.calls = getattr(self, "calls", 0) + 1
                return super().malloc(size)

        pool = CountingPool()
        cp.cuda.set_allocator(pool.malloc)
        xs = [cp.ones(1 << k) for k in range(10, 20)]
        total = float(sum(float(x.sum()) for x in xs))
        print("subclass", type(pool).__name__, pool.calls, total, pool.used_bytes())
        del xs
        pool.free_all_blocks()
        print("after free_all_blocks", pool.total_bytes())
    """,
    "set-allocator": """
        import cupy as cp
        pool = cp.cuda.MemoryPool()
        cp.cuda.set_allocator(pool.malloc)
        a = cp.arange(1 << 20)
        print("pool", pool.used_bytes(), cp.cuda.get_allocator() == pool.malloc)
        cp.cuda.set_allocator(None)
        raw = cp.arange(1 << 18)
        print("raw", type(raw.data.mem).__name__)
        with cp.cuda.using_allocator(None):
            b = cp.zeros(1000)
            print("using None", type(b.data.mem).__name__)
        cp.cuda.set_allocator(cp.get_default_memory_pool().malloc)
        c = cp.ones(5000)
        print("default", cp.get_default_memory_pool().used_bytes() > 0)
    """,
    "async-pool": """
        import cupy as cp
        pool = cp.cuda.MemoryAsyncPool()
        cp.cuda.set_allocator(pool.malloc)
        xs = [cp.ones(1 << 20) for _ in range(4)]
        print("async", float(sum(float(x.sum()) for x in xs)), cp.cuda.get_allocator() == pool.malloc)
        del xs
        cp.cuda.Device().synchronize()
        print("used after free", pool.used_bytes())
    """,
    "thread-pool": """
        import threading
        import cupy as cp
        out = {}

        def work(i):
            pool = cp.cuda.MemoryPool()
            with cp.cuda.using_allocator(pool.malloc):
                x = cp.arange(1 << (18 + i), dtype=cp.float32)
                out[i] = (float(x.sum()), pool.used_bytes())
            pool.free_all_blocks()

        ts = [threading.Thread(target=work, args=(i,)) for i in range(3)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        print("threads", sorted(out.items()))
    """,
    "oom-under-limit": """
        import cupy as cp
        cp.get_default_memory_pool().set_limit(size=64 << 20)

        def grow():
            keep = [cp.empty(8 << 20, dtype=cp.uint8) for _ in range(6)]
            return keep + [cp.empty(32 << 20, dtype=cp.uint8)]

        grow()
    """,
    "chdir": """
        import os
        import cupy as cp
        os.makedirs("elsewhere", exist_ok=True)
        os.chdir("elsewhere")
        print("in", os.path.basename(os.getcwd()), float(cp.ones(1000).sum()))
    """,
    "fork": """
        import os, sys
        import cupy as cp
        a = cp.ones(1 << 20)
        pid = os.fork()
        if pid == 0:  # a child that uses no CUDA (a forked CUDA context is unusable)
            host = [bytearray(1 << 20) for _ in range(4)]
            print("child", len(host), flush=True)
            sys.exit(7)
        _, status = os.waitpid(pid, 0)
        b = cp.ones(1 << 19)
        print("parent", os.waitstatus_to_exitcode(status), float(a.sum() + b.sum()))
    """,
    "closerange": """
        import os, time
        import cupy as cp
        a = cp.ones(1000)
        time.sleep(0.6)
        os.closerange(3, 1024)
        b = [cp.ones(1 << k) for k in range(10, 14)]
        time.sleep(0.6)
        print("daemon", float(sum(float(x.sum()) for x in b)))
    """,
    "streams-none": """
        import sys
        import cupy as cp
        print("before")
        sys.stdout = sys.stderr = None
        a = cp.ones(4096)
        raise SystemExit(3)
    """,
    "closed-fds": """
        import os
        import cupy as cp
        print("before", flush=True)
        os.close(1)
        os.close(2)
        a = cp.ones(4096)
    """,
}

TORCH: dict[str, str] = {
    "torch-resnet": """
        import torch, torchvision
        torch.manual_seed(0)
        m = torchvision.models.resnet18(num_classes=10).cuda()
        opt = torch.optim.SGD(m.parameters(), lr=0.01)
        x = torch.randn(16, 3, 64, 64, device="cuda")
        y = torch.randint(0, 10, (16,), device="cuda")
        for step in range(3):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(m(x), y)
            loss.backward()
            opt.step()
        s = torch.cuda.memory_stats()
        print("loss", round(loss.item(), 2), "allocs", s["allocation.all.allocated"])
    """,
    "torch-gpt2-config": """
        import torch
        from transformers import GPT2Config, GPT2LMHeadModel
        torch.manual_seed(0)
        cfg = GPT2Config(n_layer=2, n_head=4, n_embd=128, vocab_size=1000, n_positions=128)
        m = GPT2LMHeadModel(cfg).cuda()
        ids = torch.randint(0, 1000, (4, 64), device="cuda")
        out = m(ids, labels=ids)
        out.loss.backward()
        print("gpt2 loss", round(out.loss.item(), 2), torch.cuda.memory_stats()["allocation.all.allocated"])
    """,
    "torch-own-history": """
        import torch
        a = torch.empty(1 << 20, device="cuda")
        torch.cuda.memory._record_memory_history(max_entries=10000)
        b = [torch.empty(1 << 18, device="cuda") for _ in range(4)]
        del b[0]
        snap = torch.cuda.memory._snapshot()
        acts = [e["action"] for t in snap["device_traces"] for e in t]
        print("entries", len(acts), "allocs", acts.count("alloc"), "frees", acts.count("free_completed"))
        torch.cuda.memory._record_memory_history(enabled=None)
        c = torch.empty(1 << 19, device="cuda")
        print("after", torch.cuda.memory_allocated())
    """,
}

SITECUSTOMIZE = '''
"""Transparency witness: an independent memory hook in the program's own process."""
import os

_OUT = os.environ.get("TRACEKIT_WITNESS_OUT")
if _OUT:
    import atexit
    import threading

    _PID = os.getpid()
    _ROWS = []  # op, pointer, bytes: 0 malloc, 1 free, 2 segment (alloc_postprocess), 4 failed malloc

    def _install_cupy():
        import cupy

        class Witness(cupy.cuda.MemoryHook):
            name = "transparency-witness"

            def malloc_postprocess(self, device_id, size, mem_size, mem_ptr, pmem_id):
                if mem_ptr or size:  # a 0-byte request gets no memory and is no failure
                    _ROWS.extend((0 if mem_ptr else 4, mem_ptr, size))

            def free_postprocess(self, device_id, mem_size, mem_ptr, pmem_id):
                _ROWS.extend((1, mem_ptr, mem_size))

            def alloc_postprocess(self, device_id, mem_size, mem_ptr):
                if mem_ptr:
                    _ROWS.extend((2, mem_ptr, mem_size))

        hook = Witness()
        hook.__enter__()
        cls = threading.Thread
        original = cls._bootstrap_inner

        def bootstrap(self):
            try:
                hook.__enter__()
            except Exception:
                pass
            original(self)

        cls._bootstrap_inner = bootstrap

    if os.environ.get("TRACEKIT_WITNESS") == "cupy":
        _install_cupy()

    def _dump():
        if os.getpid() != _PID:
            return
        import json
        import sys

        out = {"rows": _ROWS}
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            out["torch_stats"] = {k: v for k, v in torch.cuda.memory_stats().items()
                                  if k.startswith(("allocation.all", "segment.all", "num_ooms"))}
        with open(_OUT, "w") as f:
            json.dump(out, f)

    atexit.register(_dump)
'''


@dataclass
class Case:
    name: str
    kind: str  # "cupy" or "torch"
    folder: Path  # copied once per run
    program: str  # file name inside the folder
    args: list[str] = field(default_factory=list)
    record_opts: list[str] = field(default_factory=list)  # options of `tracekit record` for this case


@dataclass
class Run:
    code: int
    stdout: str
    stderr: str
    seconds: float
    witness: dict[str, Any] | None
    trace: Path | None
    timed_out: bool = False


def cases(examples: Path | None, work: Path) -> list[Case]:
    out = []
    if examples is not None:
        for name, rel, args in EXAMPLES:
            path = examples / rel
            if path.exists():
                out.append(Case(name, "cupy", path.parent, path.name, args))
    for kind, programs in (("cupy", OWN), ("torch", TORCH)):
        for name, text in programs.items():
            folder = work / "src" / name
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "prog.py").write_text(textwrap.dedent(text).lstrip())
            # an async pool fires no memory hook: only --async-pools records its requests
            opts = ["--async-pools"] if name.startswith("async") else []
            out.append(Case(name, kind, folder, "prog.py", record_opts=opts))
    return out


def run_one(case: Case, recorded: bool, work: Path, path: str, timeout: float) -> Run:
    where = work / "runs" / case.name / ("rec" if recorded else "plain")
    shutil.rmtree(where, ignore_errors=True)
    shutil.copytree(case.folder, where)
    wfile = where / "witness.json"
    env = {**os.environ, "TRACEKIT_WITNESS_OUT": str(wfile), "TRACEKIT_WITNESS": case.kind,
           "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}
    trace = where / "t.parquet"
    cmd = [sys.executable, case.program, *case.args]
    if recorded:
        cmd = [sys.executable, "-m", "tracekit", "record", *(["--torch"] if case.kind == "torch" else []),
               *case.record_opts, "-o", str(trace), case.program, *case.args]
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, cwd=where, env=env, capture_output=True, text=True, timeout=timeout)
        code, so, se, late = p.returncode, p.stdout, p.stderr, False
    except subprocess.TimeoutExpired as e:
        code, so, se, late = -999, _text(e.stdout), _text(e.stderr), True
    seconds = time.perf_counter() - t0
    witness = json.loads(wfile.read_text()) if wfile.exists() else None
    so, se = (s.replace(str(where), "<dir>") for s in (so, se))
    return Run(code, so, se, seconds, witness, trace if trace.exists() else None, late)


def run_case(case: Case, work: Path, path: str, timeout: float) -> dict[str, Any]:
    """The program without and with recording, one after the other (never at once: CuPy's kernel
    and callback caches are shared), and once more each way where the two differ (the second
    recorded run tells a failure that comes every time from one that comes now and then)."""
    plain = run_one(case, False, work, path, timeout)
    rec = run_one(case, True, work, path, timeout)
    differ = (plain.code, plain.stdout, plain.stderr) != (rec.code, rec.stdout, own_lines(rec.stderr))
    again = run_one(case, False, work, path, timeout) if differ else None
    r = judge(case, plain, rec, again)
    if differ:
        rec2 = run_one(case, True, work, path, timeout)
        r["rec_again_exit"] = rec2.code
        r["rec_again_same"] = rec2.code == plain.code and masked(rec2.stdout) == masked(plain.stdout) \
            and masked(own_lines(rec2.stderr)) == masked(plain.stderr)
    return r


def _text(b: bytes | str | None) -> str:
    return b.decode(errors="replace") if isinstance(b, bytes) else (b or "")


def own_lines(stderr: str) -> str:
    return "".join(line for line in stderr.splitlines(keepends=True)
                   if not line.startswith(("Wrote ", "tracekit: ")))


NUMBER = re.compile(r"-?\d*\.\d+(?:[eE][-+]?\d+)?|pid=\d+")  # a sign too: unseeded draws flip it


def masked(text: str) -> str:
    """``text`` with signed decimal numbers (timings, unseeded random draws) and process ids masked."""
    return NUMBER.sub("#", text)


def witness_rows(w: dict[str, Any] | None) -> list[tuple[int, int, int]]:
    rows = (w or {}).get("rows") or []
    return [(rows[i], rows[i + 1], rows[i + 2]) for i in range(0, len(rows), 3)]


def raw_rows(path: Path) -> tuple[list[str], list[int], list[int], list[Any]]:
    """(op labels, addresses, sizes, pool ids) of a trace as written, every row kept: the
    comparison is with what the recorder wrote, not with what a reader makes of it."""
    import pyarrow.parquet as pq

    table = pq.read_table(path, columns=["op", "addr", "size", "pool"])
    return ([str(x) for x in table.column("op").to_pylist()],
            [int(x or 0) for x in table.column("addr").to_pylist()], table.column("size").to_pylist(),
            table.column("pool").to_pylist())


def compare_cupy(plain: Run, rec: Run) -> dict[str, Any]:
    """The trace against the witness of the recorded run (see the module docstring)."""
    from tracekit.trace import read_trace

    out: dict[str, Any] = {}
    w = witness_rows(rec.witness)
    wp = witness_rows(plain.witness)
    sizes = lambda rows, op: collections.Counter(s for o, _, s in rows if o == op)  # noqa: E731
    out["program_same"] = plain.witness is not None and all(sizes(w, op) == sizes(wp, op) for op in (0, 4))
    if rec.trace is None or rec.witness is None:
        out["trace_checked"] = False
        return out
    t = read_trace(rec.trace)  # what a reader makes of it: issues it drops, warnings it keeps
    out["reader_issues"], out["reader_warnings"] = len(t.issues), len(t.warnings)
    labels, addrs, sizes_, pools = raw_rows(rec.trace)
    kinds = {e["id"]: e["kind"] for e in t.meta.extra.get("pools") or []}
    hooked = [kinds.get(p, "pool") != "async" for p in pools]
    rows = collections.defaultdict(collections.Counter)
    for op, addr, size, h in zip(labels, addrs, sizes_, hooked, strict=True):
        if h:
            rows[op][(addr, size)] += 1
    wc = collections.defaultdict(collections.Counter)
    for o, p, s in w:
        wc[o][(p, s)] += 1
    out["trace_checked"] = True
    out["events"] = len(labels)
    out["mallocs"] = sum(rows["malloc"].values())
    out["mallocs_equal"] = rows["malloc"] == wc[0]
    out["frees"] = sum(rows["free"].values())
    out["frees_in_witness"] = not (rows["free"] - wc[1])
    out["frees_after"] = sum((wc[1] - rows["free"]).values())
    out["ooms_equal"] = sum(rows["oom"].values()) == sum(wc[4].values())
    out["segments_equal"] = rows["segment_alloc"] == wc[2]
    out["async_rows"] = sum(1 for h in hooked if not h)
    out["events_match"] = out["mallocs_equal"] and out["frees_in_witness"] and out["ooms_equal"]
    return out


def compare_torch(plain: Run, rec: Run) -> dict[str, Any]:
    from tracekit.trace import Op, read_trace

    out: dict[str, Any] = {}
    ps, rs = (plain.witness or {}).get("torch_stats"), (rec.witness or {}).get("torch_stats")
    out["program_same"] = ps is not None and ps == rs
    if rec.trace is None or rs is None:
        out["trace_checked"] = False
        return out
    t = read_trace(rec.trace)
    out["inconsistent"] = len(t.issues)
    ops = t.events.op
    out["trace_checked"] = True
    out["events"] = len(t.events)
    out["mallocs"] = int((ops == Op.MALLOC).sum())
    out["mallocs_equal"] = out["mallocs"] == rs.get("allocation.all.allocated")
    out["frees"] = int((ops == Op.FREE).sum())
    out["frees_le"] = out["frees"] <= rs.get("allocation.all.freed", 0)
    out["segments"] = int((ops == Op.SEGMENT_ALLOC).sum())
    out["segments_equal"] = out["segments"] == rs.get("segment.all.allocated")
    out["events_match"] = out["mallocs_equal"] and out["frees_le"]
    return out


def judge(case: Case, plain: Run, rec: Run, again: Run | None) -> dict[str, Any]:
    r: dict[str, Any] = {"name": case.name, "kind": case.kind, "plain_exit": plain.code, "rec_exit": rec.code,
                         "plain_s": round(plain.seconds, 2), "rec_s": round(rec.seconds, 2),
                         "timed_out": plain.timed_out or rec.timed_out}
    pe, re_ = plain.stderr, own_lines(rec.stderr)
    r["exit_same"] = plain.code == rec.code
    r["stdout_same"] = plain.stdout == rec.stdout
    r["stderr_same"] = pe == re_
    r["stdout_same_masked"] = masked(plain.stdout) == masked(rec.stdout)
    r["stderr_same_masked"] = masked(pe) == masked(re_)
    for k, a, b in (("stdout", plain.stdout, again.stdout if again else None),
                    ("stderr", pe, again.stderr if again else None)):
        # a stream that differs between two runs without tracekit is the program's own doing
        r[k + "_varies"] = b is not None and masked(a) != masked(b)
    r["trace_written"] = rec.trace is not None
    r["tracekit_lines"] = [line for line in rec.stderr.splitlines() if line.startswith("tracekit: ")]
    try:
        r.update(compare_torch(plain, rec) if case.kind == "torch" else compare_cupy(plain, rec))
    except Exception as e:  # a trace the checks cannot read is a failure of the suite, said so
        r["compare_error"] = f"{type(e).__name__}: {e}"
    if not (r["stdout_same"] and r["stderr_same"]):
        r["plain_stdout"], r["rec_stdout"] = plain.stdout[-2000:], rec.stdout[-2000:]
        r["plain_stderr"], r["rec_stderr"] = pe[-3000:], re_[-3000:]
    r["ok"] = bool(r["exit_same"] and (r["stdout_same_masked"] or r["stdout_varies"])
                   and (r["stderr_same_masked"] or r["stderr_varies"])
                   and r.get("events_match", False) and r["trace_written"])
    return r


def table(results: list[dict[str, Any]]) -> str:
    def yes(v: object) -> str:
        return "yes" if v else ("—" if v is None else "**no**")

    def exact(r: dict[str, Any], k: str) -> str:
        if r[k]:
            return "yes"
        if r[k + "_masked"]:
            return "up to timings"
        return "varies unrecorded too" if r[k.removesuffix("_same") + "_varies"] else "**no**"

    lines = ["| program | exit (plain / recorded) | exit same | stdout same | stderr same | events | "
             "mallocs = hook | frees in hook | segments = hook |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['name']} | {r['plain_exit']} / {r['rec_exit']} | {yes(r['exit_same'])} | "
                     f"{exact(r, 'stdout_same')} | {exact(r, 'stderr_same')} | {r.get('events', '—')} | "
                     f"{yes(r.get('mallocs_equal'))} | {yes(r.get('frees_in_witness', r.get('frees_le')))} | "
                     f"{yes(r.get('segments_equal'))} |")
    again = [r for r in results if "rec_again_exit" in r]
    if again:  # the cases that differed, recorded once more
        lines.append("")
        lines += [f"- {r['name']}: recorded again, exit {r['rec_again_exit']}, "
                  f"{'the same as plain' if r['rec_again_same'] else 'different from plain'}" for r in again]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--examples", type=Path, default=None, help="CuPy's examples/ folder")
    ap.add_argument("--jobs", type=int, default=6)
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--pythonpath", default="", help="more folders for the programs' PYTHONPATH")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    work = args.out / "work"
    witness_dir = work / "witness"
    witness_dir.mkdir(parents=True, exist_ok=True)
    (witness_dir / "sitecustomize.py").write_text(SITECUSTOMIZE)
    todo = [c for c in cases(args.examples, work) if args.only is None or c.name in args.only]
    todo.sort(key=lambda c: c.name not in LONG)  # the longest first, so they do not end the run alone
    path = os.pathsep.join(p for p in (str(witness_dir), str(ROOT), args.pythonpath) if p)
    results: list[dict[str, Any]] = []
    with ThreadPoolExecutor(args.jobs) as ex:
        for r in ex.map(lambda c: run_case(c, work, path, args.timeout), todo):
            results.append(r)  # written as they come: a run cut short still leaves the finished ones
            (args.out / "transparency.json").write_text(json.dumps(results, indent=2, default=str))
            (args.out / "transparency.md").write_text(table(results) + "\n")
    bad = [r["name"] for r in results if not r["ok"]]
    print(table(results))
    print(f"{len(results) - len(bad)} of {len(results)} programs transparent; not: {bad}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
