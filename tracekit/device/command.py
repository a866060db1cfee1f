"""``tracekit replay TRACE --device N``: read, replay on the GPU, write the trace, summarize.

``run_device_replay`` is what the replay verb calls when ``--device`` is
given. It checks the arguments and the output path before touching the GPU,
replays (``tracekit.device.replay``; ``--allocator torch``:
``tracekit.device.torch_replay``), writes the output trace and returns a
``DeviceReplayOutcome``: the summary, with ``--compare-sim POLICY`` the same
trace and capacity through the simulator side by side (for ``torch`` also
reserved bytes request by request, ``tracekit.device.torch_compare``), and
the sentence for ``--fail-on-oom``. The CLI prints it. No polars on this
path: the GPU machines that run it need only NumPy, pyarrow and CuPy or PyTorch.
"""

from __future__ import annotations

import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NotRequired, TypedDict, cast

from tracekit.device.capacity import Allocator, parse_allocator
from tracekit.device.compare import SimComparison, SimComparisonDict
from tracekit.device.figures import DeviceFiguresDict, TorchFiguresDict
from tracekit.errors import UsageError
from tracekit.sim.result import ReplaySummary, ReplaySummaryDict
from tracekit.units import parse_size


def check_args(device: int, allocator: str, capacity: str | None,
               torch_conf: str | None = None) -> tuple[Allocator, int | None]:
    """Validate the options (no GPU needed); return the allocator and capacity in bytes."""
    if device < 0:
        raise UsageError(f"--device must be a CUDA device ordinal (0, 1, ...), got {device}")
    alloc = parse_allocator(allocator)
    if torch_conf is not None and alloc is not Allocator.TORCH:
        raise UsageError("--torch-conf settings apply to --sim torch, or to --device with --allocator torch")
    if capacity is not None and capacity.strip().lower() in ("none", "unbounded"):
        return alloc, None
    cap = parse_size(capacity, "--capacity") if capacity is not None else None
    if cap is not None and cap <= 0:
        raise UsageError(f"--capacity must be positive, got {capacity!r}")
    return alloc, cap


class DeviceReplayDict(ReplaySummaryDict):
    """``replay --device N --json``: the one replay summary, its ``device`` group (and ``torch``
    through PyTorch's allocator), and ``compare_sim`` with ``--compare-sim``."""

    device: DeviceFiguresDict
    torch: NotRequired[TorchFiguresDict]
    compare_sim: NotRequired[SimComparisonDict]


class ReplayMetaDict(TypedDict):
    """The output trace's ``replay`` metadata: what was replayed where (bytes)."""

    kind: str  # "device"
    device_index: int
    allocator: str
    capacity: int | None
    ballast_bytes: int
    free_at_start: int  # free memory the replay had (after any ballast)
    input: str


@dataclass(frozen=True)
class DeviceReplayOutcome:
    """What a device replay produced: its summary, the comparison, the file written, the verdict."""

    summary: ReplaySummary
    comparison: SimComparison | None
    written: Path | None
    verdict: str | None  # the sentence for --fail-on-oom when any request failed, else None

    def to_dict(self) -> DeviceReplayDict:
        # The summary carries the device group (and torch): its groups add their own keys.
        d = cast(DeviceReplayDict, self.summary.to_dict())
        if self.comparison is not None:
            d["compare_sim"] = self.comparison.to_dict()
        return d

    def to_text(self) -> str:
        text = self.summary.to_text()
        if self.comparison is not None:
            from tracekit.device.compare import format_comparison

            text += "\n" + format_comparison(self.comparison)
        return text


def run_device_replay(
    trace: Path, *, device: int, allocator: str, capacity: str | None, output: Path | None,
    continue_on_oom: bool, compare_sim: str | None, torch_conf: str | None = None, force: bool = False,
    stop_at_first_oom: bool = False,
) -> DeviceReplayOutcome:
    """The ``replay --device`` verb body, without printing."""
    from tracekit.device.replay import DeviceConfig, replay_on_device
    from tracekit.device.result import summary
    from tracekit.outputs import check_output
    from tracekit.sim.options import parse_alloc_conf
    from tracekit.trace.reader import read_meta, read_trace

    alloc, cap = check_args(device, allocator, capacity, torch_conf)
    if alloc is Allocator.RMM_POOL:  # before the GPU is touched: one sentence where RMM is missing
        from tracekit.device.rmm_backend import import_rmm

        import_rmm()
    if alloc is Allocator.TORCH and capacity is None:
        cap = read_meta(trace).pool_limit_bytes or None  # the recorded limit, as --sim torch takes it
    options = parse_alloc_conf(torch_conf) if torch_conf is not None else {}
    if output is not None:
        check_output(output, (trace,), force=force)
    if compare_sim is not None:
        from tracekit.device.compare import check_policy

        check_policy(compare_sim)
    tr = read_trace(trace)
    cfg = DeviceConfig(device=device, allocator=alloc, capacity=cap, continue_on_oom=continue_on_oom,
                       options=options, stop_at_first_oom=stop_at_first_oom)
    run = replay_on_device(tr, cfg)  # SIGTERM: Interrupted (exit 143) once the device is released
    result = summary(tr, run)
    written = write_output(tr, run, output) if output is not None else None
    comparison = None
    if compare_sim is not None:
        comparison = _compare(tr, run, compare_sim, cap, continue_on_oom, result, written)
    verdict = None
    if run.ooms:
        verdict = (f"{trace}: {run.ooms} allocation(s) ran out of memory on device {device} "
                   f"with the {alloc.value} allocator")
    return DeviceReplayOutcome(result, comparison, written, verdict)


def _compare(tr: Any, run: Any, policy: str, cap: int | None, continue_on_oom: bool,
             result: ReplaySummary, written: Path | None) -> SimComparison:
    """The side-by-side table; for torch against torch also reserved bytes after every request."""
    from tracekit.device.compare import compare_with_sim

    comparison = compare_with_sim(tr, policy, cap, continue_on_oom, result, run.config.options,
                                  run.config.stop_at_first_oom)
    from tracekit.sim import policies

    if run.torch is None or policies.allocator_of(policy) != Allocator.TORCH:
        return comparison
    from tracekit.device.torch_compare import compare_with_model
    from tracekit.trace.reader import read_trace

    with tempfile.TemporaryDirectory(prefix="tracekit-") as tmp:
        path = written if written is not None else write_output(tr, run, Path(tmp) / "replay.parquet")
        reserved = compare_with_model(tr, run, read_trace(path))
    return replace(comparison, reserved=tuple(reserved))


def write_output(tr: Any, run: Any, output: Path) -> Path:
    """Write the replay as a v1 trace with device, allocator and capacity in its metadata."""
    from tracekit.device.result import extra_fields, output_events
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
        replay=ReplayMetaDict(kind="device", device_index=run.config.device,
                              allocator=run.config.allocator.value, capacity=run.plan.capacity,
                              ballast_bytes=run.plan.ballast_bytes, free_at_start=run.free_replay,
                              input=str(tr.path)),
        allocator=run.config.allocator.value,
        policy=run.config.allocator.value,
        capacity=run.plan.capacity,
        device_total=run.free_replay,  # what the replay had: the emulated device under any pool limit
    )
    if run.torch is not None:  # the settings as PyTorch reported them: --sim torch replays the output alike
        meta = meta.with_extra(torch_allocator_settings=dict(run.torch.settings),
                               torch_conf=run.torch.conf, torch_version=run.torch.torch_version)
    return write_trace(output, meta, ev, extras, extra_fields=extra_fields(run))


def _device_name(device: int) -> str | None:
    try:
        if "torch" in sys.modules:
            return str(sys.modules["torch"].cuda.get_device_name(device))
        import cupy

        name = cupy.cuda.runtime.getDeviceProperties(device)["name"]
        return name.decode() if isinstance(name, bytes) else str(name)
    except Exception:
        return None
