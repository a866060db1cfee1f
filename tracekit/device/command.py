"""``tracekit replay TRACE --device N``: read, replay on the GPU, write the trace, print the summary.

``run_device_replay_cli`` is what the replay verb calls when ``--device`` is
given. It checks the arguments and the output path before touching the GPU,
replays (``tracekit.device.replay``), writes the output trace, prints the JSON
or a short text summary and, with ``--compare-sim POLICY``, the same trace and
capacity through the simulator side by side. No polars on this path: the GPU
machines that run it need only NumPy, pyarrow and CuPy.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer

from tracekit.device.capacity import Allocator
from tracekit.errors import OOMVerdict, UsageError
from tracekit.units import format_size, parse_size


def check_args(device: int, allocator: str, capacity: str | None) -> tuple[Allocator, int | None]:
    """Validate the options (no GPU needed); return the allocator and capacity in bytes."""
    if device < 0:
        raise UsageError(f"--device must be a CUDA device ordinal (0, 1, ...), got {device}")
    alloc = Allocator.parse(allocator)
    cap = parse_size(capacity, "--capacity") if capacity is not None else None
    if cap is not None and cap <= 0:
        raise UsageError(f"--capacity must be positive, got {capacity!r}")
    return alloc, cap


def run_device_replay_cli(
    trace: Path, *, device: int, allocator: str, capacity: str | None, output: Path | None,
    json_out: bool, fail_on_oom: bool, continue_on_oom: bool, compare_sim: str | None,
    force: bool = False,
) -> None:
    """The ``replay --device`` verb body; raises OOMVerdict when ``fail_on_oom`` and an OOM happened."""
    from tracekit.cli.common import echo_json, wrote
    from tracekit.device.replay import DeviceConfig, replay_on_device
    from tracekit.device.result import summary
    from tracekit.outputs import check_output
    from tracekit.trace.reader import read_trace

    alloc, cap = check_args(device, allocator, capacity)
    if output is not None:
        check_output(output, (trace,), force=force)
    if compare_sim is not None:
        from tracekit.device.compare import check_policy

        check_policy(compare_sim)
    tr = read_trace(trace)
    cfg = DeviceConfig(device=device, allocator=alloc, capacity=cap, continue_on_oom=continue_on_oom)
    run = replay_on_device(tr, cfg)  # SIGTERM: Terminated (exit 143) once the device is released
    result = summary(tr, run)
    if output is not None:
        wrote(write_output(tr, run, output))
    comparison = None
    if compare_sim is not None:
        from tracekit.device.compare import compare_with_sim

        comparison = compare_with_sim(tr, compare_sim, cap, continue_on_oom, result)
    if json_out:
        echo_json({**result, "compare_sim": comparison} if comparison is not None else result)
    else:
        typer.echo(text_summary(result))
        if comparison is not None:
            from tracekit.device.compare import format_comparison

            typer.echo(format_comparison(comparison))
    if fail_on_oom and run.ooms:
        raise OOMVerdict(f"{trace}: {run.ooms} allocation(s) ran out of memory on device {device} "
                         f"with the {alloc.value} allocator")


def write_output(tr: Any, run: Any, output: Path) -> Path:
    """Write the replay as a v1 trace with device, allocator and capacity in its metadata."""
    from tracekit.device.result import output_events
    from tracekit.trace.schema import DeviceInfo, Source, TraceMeta
    from tracekit.trace.writer import write_trace

    ev, extras = output_events(tr, run)
    name = _device_name(run.config.device)
    meta = TraceMeta.new(
        Source.REPLAY,
        device=DeviceInfo(name, run.total, run.free_start),
        pool_limit_bytes=run.plan.pool_limit,
        command=" ".join(sys.argv),
    ).with_extra(
        replay={"kind": "device", "device_index": run.config.device, "allocator": run.config.allocator.value,
                "capacity": run.plan.capacity, "ballast_bytes": run.plan.ballast,
                "free_at_start": run.free_replay, "input": str(tr.path)},
        allocator=run.config.allocator.value,
        policy=run.config.allocator.value,
        capacity=run.plan.capacity,
        device_total=run.free_replay,  # what the replay had: the emulated device under any pool limit
    )
    return write_trace(output, meta, ev, extras, extra_fields=_fields())


def _fields() -> tuple[Any, ...]:
    from tracekit.device.result import EXTRA_FIELDS

    return EXTRA_FIELDS


def _device_name(device: int) -> str | None:
    try:
        import cupy

        name = cupy.cuda.runtime.getDeviceProperties(device)["name"]
        return name.decode() if isinstance(name, bytes) else str(name)
    except Exception:
        return None


def text_summary(r: dict[str, Any]) -> str:
    """A few lines for a human: what ran, peaks, the OOM, latencies, whether memory came back."""
    cap = "whole free memory" if r["capacity"] is None else format_size(r["capacity"])
    lines = [
        f"device {r['device']}, allocator {r['allocator']}, capacity {cap}: "
        f"{r['replayed']:,} of {r['events']:,} events replayed",
        f"  peak live {format_size(r['peak_live_bytes'])}, "
        f"peak reserved {format_size(r['peak_reserved_bytes'])}, "
        f"segment allocs {r['segment_allocs']:,}, frees {r['segment_frees']:,}",
    ]
    oom = r["oom"]
    if oom is None:
        lines.append("  no out-of-memory")
    else:
        lines.append(f"  OOM at seq {oom['seq']}: {format_size(oom['size'])} requested, "
                     f"{format_size(oom['free_bytes'])} free ({r['oom_count']} OOM(s) in all)")
    m, f = r["malloc_latency_ns"], r["free_latency_ns"]
    lines.append(f"  malloc latency p50 {_us(m['p50'])}, p99 {_us(m['p99'])}; "
                 f"free p50 {_us(f['p50'])}, p99 {_us(f['p99'])}")
    lines.append("  device memory released: " + ("yes" if r["released"] else
                 f"NO ({r['device_free_start'] - r['device_free_end']:,} bytes still taken)"))
    return "\n".join(lines)


def _us(ns: float | None) -> str:
    return "n/a" if ns is None else f"{ns / 1000:.1f} µs"
