"""RMM on the GPU: log two real programs through RMM, replay each log through the ``rmm-pool`` model and
through RMM's real ``PoolMemoryResource``, and bisect the smallest maximum pool size both ways.

Steps, each program in a fresh child process (so RMM and the array library start clean):

1. **record**: a CuPy program on ``rmm.allocators.cupy.rmm_cupy_allocator`` (FFTs, sorts, matmuls,
   reductions of varying sizes in a loop) and a PyTorch one on ``rmm.allocators.torch.
   rmm_torch_allocator`` (a few training steps of torchvision's resnet18, or of a small residual
   network written here where torchvision is absent), each under ``rmm.reinitialize(logging=True,
   log_file_name=...)`` over ``CudaMemoryResource`` (no pool: the log is the program's requests);
2. **import**: each log through ``tracekit.importers.rmm_log`` (``tracekit import rmm``);
3. **scan**: at maximum pool sizes of 1.0 to 2.0 times the peak of live (256 B-aligned) bytes, with an
   initial pool of 0 and of the whole maximum, the model's first failing event and peak pool size
   against RMM's real pool (``PoolMemoryResource(CudaMemoryResource(), initial, maximum)``,
   every allocate and free of the trace replayed in order, ``MemoryError`` marking the first
   failing event, ``pool_size()`` the peak since the pool never shrinks);
4. **bisect**: the smallest maximum pool size (to ``--step``) with no failing event, on the device
   and with the model (initial pool 0), then a scan upwards from the peak of live bytes to it (at
   most 96 sizes): fitting need not be monotone in the maximum, and the scan says where it is not.

Results: ``rmm_fidelity.json`` under ``--out`` (``FidelityJSON``), with the logs
(``rmm-<program>.dev0.csv``) and their traces (``rmm-<program>.parquet``) beside it.
``--dry-run`` (no GPU): synthetic logs stand in for the programs and the device steps are skipped,
so the plumbing runs anywhere. One command on the device, RMM's wheels carried in ``.whl/``::

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \\
        --target /tmp/site .whl/*.whl && PYTHONPATH=/tmp/site python3 scripts/gpu_rmm_fidelity.py --out "$OUT"
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypedDict

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MiB = 1 << 20
ALIGN = 256
SCAN = (1.0, 1.02, 1.05, 1.1, 1.25, 1.5, 2.0)  # maxima as multiples of the peak live bytes


class PointJSON(TypedDict):
    """One maximum pool size: the model's answer and the device's (None with --dry-run)."""

    maximum_bytes: int
    initial_bytes: int
    model_first_oom: int | None  # input event index of the first failing request, None if none
    model_peak_pool_bytes: int
    device_first_oom: int | None
    device_peak_pool_bytes: int | None
    same_oom: bool | None
    peak_pool_error: float | None  # |model - device| / device


class BisectJSON(TypedDict):
    """The smallest maximum pool size (to ``step_bytes``) that replays without a failing event:
    by bisection, and by a scan upwards from the peak of live bytes to the bisection's answer (RMM's
    growth by halves of the remainder makes fitting not monotone in the maximum)."""

    step_bytes: int
    model_bytes: int | None
    device_bytes: int | None
    model_steps: int
    device_steps: int
    scan_step_bytes: int
    model_scanned_bytes: int | None  # the smallest size of the scan that fits
    device_scanned_bytes: int | None
    model_monotone: bool  # no scanned size above the smallest fitting one fails
    device_monotone: bool | None


class ProgramJSON(TypedDict):
    name: str  # cupy or torch
    what: str  # what ran
    log: str
    trace: str
    log_rows: int
    events: int
    streams: int
    peak_live_bytes: int  # 256 B-aligned, the lower bound of every maximum
    record_s: float
    points: list[PointJSON]
    bisect: BisectJSON
    device_replay_s: float | None


class FidelityJSON(TypedDict):
    dry_run: bool
    device: str | None
    versions: dict[str, str]
    programs: list[ProgramJSON]
    wall_s: float


# -- the recorded programs (run in a child: ``--child cupy LOG``) ------------------------------------


def _cupy_program(log: Path, steps: int) -> str:
    import cupy as cp
    import rmm
    from rmm.allocators.cupy import rmm_cupy_allocator

    rmm.reinitialize(pool_allocator=False, logging=True, log_file_name=str(log))
    cp.cuda.set_allocator(rmm_cupy_allocator)
    rng = cp.random.default_rng(0)
    for k in range(steps):
        n = 1 << (16 + k % 6)  # 64 Ki .. 2 Mi elements
        x = rng.standard_normal(n, dtype=cp.float32)
        f = cp.fft.rfft(x)
        y = cp.fft.irfft(f * cp.exp(-cp.abs(f) / n), n)
        s = cp.sort(y)[:: max(1, n >> 10)]
        m = 256 + 128 * (k % 5)
        a = rng.standard_normal((m, m), dtype=cp.float32)
        b = a @ a.T + cp.eye(m, dtype=cp.float32)
        c = cp.linalg.norm(b, axis=1).sum() + s.sum() + cp.cumsum(x).max()
        keep = [rng.random(1 << (10 + (k + j) % 10)) for j in range(4)]
        del x, f, y, a, b, keep
        float(c)
    cp.cuda.runtime.deviceSynchronize()
    return f"CuPy {cp.__version__}: {steps} steps of rfft/irfft, sort, matmul, cumsum, random arrays"


def _torch_program(log: Path, steps: int) -> str:
    import rmm
    import torch
    from rmm.allocators.torch import rmm_torch_allocator

    rmm.reinitialize(pool_allocator=False, logging=True, log_file_name=str(log))
    torch.cuda.memory.change_current_allocator(rmm_torch_allocator)  # before CUDA starts
    torch.manual_seed(0)
    try:
        import torchvision

        model: torch.nn.Module = torchvision.models.resnet18(num_classes=100)
        what = f"torchvision {torchvision.__version__} resnet18"
    except ImportError:
        model = _small_resnet(torch)
        what = "a 6-block residual CNN (torchvision absent)"
    model = model.cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    for _ in range(steps):
        x = torch.randn(32, 3, 128, 128, device="cuda")
        y = torch.randint(0, 100, (32,), device="cuda")
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        float(loss)
    torch.cuda.synchronize()
    return f"PyTorch {torch.__version__}: {steps} SGD steps of {what}, batch 32 of 3x128x128"


def _small_resnet(torch):  # type: ignore[no-untyped-def]
    nn = torch.nn

    class Block(nn.Module):  # type: ignore[misc,name-defined]
        def __init__(self, c: int) -> None:
            super().__init__()
            self.a = nn.Conv2d(c, c, 3, padding=1)
            self.b = nn.Conv2d(c, c, 3, padding=1)
            self.n = nn.BatchNorm2d(c)

        def forward(self, x):  # type: ignore[no-untyped-def]
            return torch.relu(x + self.n(self.b(torch.relu(self.a(x)))))

    return nn.Sequential(nn.Conv2d(3, 64, 7, stride=2, padding=3), *[Block(64) for _ in range(6)],
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 100))


def _child(name: str, log: Path, steps: int) -> None:
    what = _cupy_program(log, steps) if name == "cupy" else _torch_program(log, steps)
    import rmm

    mr = rmm.mr.get_current_device_resource()
    if isinstance(mr, rmm.mr.LoggingResourceAdaptor):
        mr.flush()  # the log complete on disk before the interpreter's teardown
    files = {int(k): v for k, v in rmm.get_log_filenames().items()}
    print(json.dumps({"what": what, "logs": files}))


def _record(name: str, out: Path, steps: int) -> tuple[Path, str, float]:
    """Run program ``name`` in a child process; the log of device 0, what ran, seconds."""
    base = out / f"rmm-{name}.csv"
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, __file__, "--child", name, str(base), "--steps", str(steps)],
                       capture_output=True, text=True, timeout=240, check=False)
    if p.returncode != 0:
        raise SystemExit(f"the {name} program failed (exit {p.returncode}):\n{p.stderr[-4000:]}")
    info = json.loads(p.stdout.strip().splitlines()[-1])
    return Path(info["logs"].get("0") or out / f"rmm-{name}.dev0.csv"), info["what"], time.perf_counter() - t0


# -- replays -----------------------------------------------------------------------------------------


def _model(trace, maximum: int, initial: int) -> tuple[int | None, int]:  # type: ignore[no-untyped-def]
    from tracekit.sim.base import SimConfig
    from tracekit.sim.codes import Stat
    from tracekit.sim.policies.rmm_pool import MODEL

    run = MODEL.run(trace, SimConfig(capacity=maximum, options={"initial_pool_size": str(initial)}))
    first = int(run.stats[Stat.FIRST_OOM])
    return (first if first >= 0 else None), int(run.stats[Stat.PEAK_RESERVED])


class DeviceReplay:
    """The trace's requests through RMM's real pool, one ``PoolMemoryResource`` per call."""

    def __init__(self, trace) -> None:  # type: ignore[no-untyped-def]
        from tracekit.trace import Op

        ev = trace.events
        self.op = ev.op.tolist()
        self.size = ev.size.tolist()
        self.mate = trace.mate.tolist()
        self.stream = ev.stream.tolist()
        self.malloc, self.free, self.oom = int(Op.MALLOC), int(Op.FREE), int(Op.OOM)
        self.seconds = 0.0

    def __call__(self, maximum: int, initial: int) -> tuple[int | None, int]:
        import rmm
        from rmm.pylibrmm.stream import DEFAULT_STREAM, Stream

        t0 = time.perf_counter()
        streams: dict[int, Stream] = {}

        def stream_of(s: int) -> Stream:
            if s in (0, 1):
                return DEFAULT_STREAM
            if s not in streams:
                streams[s] = Stream()
            return streams[s]

        pool = rmm.mr.PoolMemoryResource(rmm.mr.CudaMemoryResource(), initial_pool_size=initial,
                                         maximum_pool_size=maximum)
        ptr: dict[int, int] = {}
        first: int | None = None
        try:
            for i, o in enumerate(self.op):
                if o == self.malloc or o == self.oom:
                    if self.size[i] == 0:
                        continue
                    try:
                        p = pool.allocate(self.size[i], stream_of(self.stream[i]))
                    except MemoryError:
                        first = i
                        break
                    if o == self.oom:  # a request the program survived: given back at once
                        pool.deallocate(p, self.size[i], stream_of(self.stream[i]))
                    else:
                        ptr[i] = p
                elif o == self.free and self.mate[i] in ptr:
                    m = self.mate[i]
                    pool.deallocate(ptr.pop(m), self.size[m], stream_of(self.stream[i]))
            peak = int(pool.pool_size())
        finally:
            for m, p in ptr.items():
                pool.deallocate(p, self.size[m], stream_of(self.stream[m]))
            del pool
            gc.collect()
            self.seconds += time.perf_counter() - t0
        return first, peak


def bisect(fits: Callable[[int], bool], lo: int, step: int) -> tuple[int | None, int]:
    """The smallest multiple of ``step`` at or above ``lo`` where ``fits``, searching upwards by
    doubling then halving (assumes fitting is monotone in the size); (size, calls)."""
    lo = -(-lo // step) * step
    calls = 1
    if fits(lo):
        return lo, calls
    gap = step
    hi = lo + gap
    while True:
        calls += 1
        if fits(hi):
            break
        if hi > 1 << 46:
            return None, calls
        gap *= 2
        lo, hi = hi, hi + gap
    while hi - lo > step:
        mid = (lo + hi) // 2 // step * step
        calls += 1
        if fits(mid):
            hi = mid
        else:
            lo = mid
    return hi, calls


def scan(fits: Callable[[int], bool], lo: int, hi: int | None, step: int,
         most: int = 96) -> tuple[int | None, bool, int]:
    """Every size from ``lo`` to ``hi`` (at most ``most`` of them, a multiple of ``step`` apart):
    (the smallest that fits, whether every larger one fits too, the spacing)."""
    if hi is None:
        return None, True, step
    lo = -(-lo // step) * step
    spacing = max(step, -(-(hi - lo) // most // step) * step)
    ok = [fits(c) for c in range(lo, hi + 1, spacing)]
    if not any(ok):
        return None, True, spacing
    first = ok.index(True)
    return lo + first * spacing, all(ok[first:]), spacing


def _recorded_what(name: str) -> str | None:
    """What the committed record (``traces/fidelity/rmm.json``) says the program ``name`` was."""
    try:
        old = json.loads((ROOT / "traces" / "fidelity" / "rmm.json").read_text())
        return next(str(p["what"]) for p in old["programs"] if p["name"] == name)
    except (OSError, ValueError, KeyError, StopIteration):
        return None


def _program(name: str, out: Path, dry: bool, steps: int, step: int, logs: Path | None = None) -> ProgramJSON:
    from tracekit.importers.rmm_log import import_log
    from tracekit.trace.reader import read_trace

    t0 = time.perf_counter()
    if dry:
        sys.path.insert(0, str(ROOT / "scripts"))
        from rmm_synth_log import write_log

        log = out / f"rmm-{name}.dev0.csv"
        write_log(log, 4000 if name == "cupy" else 6000, seed=1 if name == "cupy" else 2,
                  streams=1 if name == "cupy" else 2)
        what = f"synthetic stand-in for the {name} program (--dry-run)"
    elif logs is not None:  # a log recorded before (the committed ones): the same requests again
        log = logs / f"rmm-{name}.dev0.csv"
        what = _recorded_what(name) or f"the {name} program's log {log.name}, recorded before"
    else:
        log, what = _record(name, out, steps)[:2]
    record_s = time.perf_counter() - t0
    res = import_log(log, out / f"rmm-{name}.parquet", force=True)
    trace = read_trace(res.path)
    ev = trace.events
    live = np.where(ev.op == 0, ((ev.size.astype(np.int64) + ALIGN - 1) // ALIGN) * ALIGN, 0)
    live -= np.where((ev.op == 1) & (trace.mate >= 0), ev.size.astype(np.int64), 0)
    peak_live = int(np.cumsum(live).max()) if len(live) else 0
    device = None if dry else DeviceReplay(trace)
    points: list[PointJSON] = []
    for k in SCAN:
        maximum = int(peak_live * k) // ALIGN * ALIGN
        for initial in (0, maximum):
            m_first, m_peak = _model(trace, maximum, initial)
            d_first, d_peak = device(maximum, initial) if device is not None else (None, None)
            points.append(PointJSON(
                maximum_bytes=maximum, initial_bytes=initial, model_first_oom=m_first,
                model_peak_pool_bytes=m_peak,
                device_first_oom=d_first, device_peak_pool_bytes=d_peak,
                same_oom=None if device is None else m_first == d_first,
                peak_pool_error=None if not d_peak else abs(m_peak - d_peak) / d_peak,
            ))
    m_size, m_steps = bisect(lambda c: _model(trace, c, 0)[0] is None, peak_live, step)
    d_size, d_steps = (None, 0)
    if device is not None:
        d_size, d_steps = bisect(lambda c: device(c, 0)[0] is None, peak_live, step)
    m_scan, m_mono, spacing = scan(lambda c: _model(trace, c, 0)[0] is None, peak_live, m_size, step)
    d_scan, d_mono = None, None
    if device is not None:
        d_scan, d_mono, _ = scan(lambda c: device(c, 0)[0] is None, peak_live, d_size, spacing, 96)
    return ProgramJSON(
        name=name, what=what, log=log.name, trace=res.path.name,
        log_rows=int(trace.meta.extra.get("rmm_import", {}).get("rows", len(ev))), events=len(ev),
        streams=len(np.unique(ev.stream)), peak_live_bytes=peak_live, record_s=round(record_s, 2),
        points=points, bisect=BisectJSON(step_bytes=step, model_bytes=m_size, device_bytes=d_size,
                                         model_steps=m_steps, device_steps=d_steps, scan_step_bytes=spacing,
                                         model_scanned_bytes=m_scan, device_scanned_bytes=d_scan,
                                         model_monotone=m_mono, device_monotone=d_mono),
        device_replay_s=round(device.seconds, 2) if device is not None else None,
    )


def _versions(dry: bool) -> tuple[str | None, dict[str, str]]:
    if dry:
        return None, {}
    try:
        import cupy
        import rmm
    except ImportError as e:
        raise SystemExit(f"{e}: install RMM's wheels first (python3 -m pip install --no-index --no-deps "
                         "--target /tmp/site .whl/*.whl; PYTHONPATH=/tmp/site), or give --dry-run") from None

    props = cupy.cuda.runtime.getDeviceProperties(0)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    return name, {"rmm": rmm.__version__, "cupy": cupy.__version__,
                  "cuda_runtime": str(cupy.cuda.runtime.runtimeGetVersion())}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="folder for rmm_fidelity.json, the logs and traces")
    ap.add_argument("--dry-run", action="store_true", help="no GPU: synthetic logs, model only")
    ap.add_argument("--steps", type=int, default=0, help="program steps (default: cupy 60, torch 6)")
    ap.add_argument("--step", type=int, default=2 * MiB, help="bisection step in bytes (default 2 MiB)")
    ap.add_argument("--programs", default="cupy,torch")
    ap.add_argument("--logs", type=Path, default=None,
                    help="replay the logs rmm-<program>.dev0.csv in this folder (traces/: the committed "
                         "ones) instead of recording the programs again")
    ap.add_argument("--child", nargs=2, metavar=("PROGRAM", "LOG"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        _child(a.child[0], Path(a.child[1]), a.steps or (60 if a.child[0] == "cupy" else 6))
        return 0
    if a.out is None:
        ap.error("--out is required")
    a.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    device, versions = _versions(a.dry_run)
    programs = [_program(n, a.out.resolve(), a.dry_run, a.steps or (60 if n == "cupy" else 6), a.step,
                         a.logs.resolve() if a.logs is not None else None)
                for n in a.programs.split(",")]
    result = FidelityJSON(dry_run=a.dry_run, device=device, versions=versions, programs=programs,
                          wall_s=round(time.perf_counter() - t0, 1))
    path = a.out / "rmm_fidelity.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    for p in programs:
        b = p["bisect"]
        print(f"{p['name']}: {p['events']} events, peak live {p['peak_live_bytes']} B; smallest maximum "
              f"(bisected / scanned) model {b['model_bytes']} / {b['model_scanned_bytes']} B, device "
              f"{b['device_bytes']} / {b['device_scanned_bytes']} B; same first failure at "
              f"{sum(1 for x in p['points'] if x['same_oom'])}/{len(p['points'])} points", file=sys.stderr)
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("RMM_LOGGING_LEVEL", "WARN")
    raise SystemExit(main())
