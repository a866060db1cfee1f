"""Device replay through PyTorch's own caching allocator on a real GPU.

Marked ``gpu``; also skipped where PyTorch or its CUDA device is missing. The
committed PyTorch traces are replayed under their recorded settings and limit
and compared, reserved bytes after every request, with the ``torch`` model.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tracekit.device.torch_compare import compare_with_model, device_reserved, replayed_requests
from tracekit.device.torch_replay import replay_torch_on_device
from tracekit.errors import UsageError
from tracekit.trace import Op, read_trace
from tracekit.trace.outcome import handled_rows

ROOT = Path(__file__).resolve().parents[2]
TORCH_TRACES = sorted((ROOT / "traces").glob("torch-*.parquet"))
# Recordings PyTorch's own allocator does not reproduce when replayed, and what was seen (H200).
# Traces where equal free blocks lie in another address order on this device than in the recording:
# PyTorch breaks such ties by address, so from the first one on the device follows its own layout.
# The model fed this device's addresses must still agree on every request.
ADDRESS_ORDER = {
    "torch-handled-oom": "from request 774 on, a tie between two free 128 KiB blocks falls by address, and "
                         "this device laid those segments out in the other order than the recorded run "
                         "(the model with this device's addresses agrees on all 12,530 requests)",
    "torch-resnet-fraction": "from request 845 on, the model fed the recorded run's addresses reserves 2 MiB "
                             "less than this device (377,487,360 vs 379,584,512 bytes): the same ResNet-50 "
                             "run as torch-handled-oom, whose ties fall by address; the model with this "
                             "device's addresses agrees on all 12,566 requests",
}


def _torch_reason() -> str | None:
    try:
        import torch
    except Exception as e:
        return f"PyTorch is not importable ({type(e).__name__})"
    return None if torch.cuda.is_available() else "PyTorch sees no CUDA device"


pytestmark = [pytest.mark.gpu, pytest.mark.torch,
              pytest.mark.skipif(_torch_reason() is not None, reason=str(_torch_reason()))]


def _other_gpu(trace) -> str | None:
    """Why the recorded run's layout need not hold here, where this GPU is not the model the trace was
    recorded on (None where it is): its segments lie at other addresses, PyTorch breaks ties between
    equal free blocks by address, and so the layout, and a request near the limit, can go another
    way (seen on an H100 for H200 recordings, 2026-12-07: torch-dcgan from request 192 on, and
    torch-resnet35 failing 8 rows before its recorded fatal OOM, at a 31.85 MB malloc). The model
    fed this device's addresses is checked on every request before this is asked."""
    import torch

    here, there = torch.cuda.get_device_name(0), trace.meta.device.name if trace.meta.device else None
    if there is None or here == there:
        return None
    return (f"replayed on an {here}, recorded on an {there}: other addresses, so ties between equal free "
            f"blocks fall another way")


def _free() -> int:
    import torch

    torch.cuda.synchronize()
    return int(torch.cuda.mem_get_info(0)[0])


def _recorded_reserved(trace) -> np.ndarray:
    """Reserved bytes after each event from the recording's own segment rows (after the starting state)."""
    from tracekit.device.compare import reserved_by_request

    ev = trace.events
    seg = np.flatnonzero((ev.op == Op.SEGMENT_ALLOC) | (ev.op == Op.SEGMENT_FREE))
    return reserved_by_request(len(ev), seg, ev.op[seg], ev.size[seg])


@pytest.mark.parametrize("path", TORCH_TRACES, ids=lambda p: p.stem)
def test_committed_trace_agrees_with_the_model_request_by_request(path: Path, tmp_path: Path) -> None:
    import torch

    from tracekit.device.command import write_output

    trace = read_trace(path)
    # past a failed request, as a program that handles its OOMs goes on (torch-handled-oom)
    run = replay_torch_on_device(trace, None, trace.meta.pool_limit_bytes, 0, continue_on_oom=True)
    # free_start is taken once the replay's side streams exist (PyTorch keeps its stream pool)
    assert run.free_end == run.free_start, "device memory not given back"
    assert torch.cuda.memory_reserved(0) == 0
    out = read_trace(write_output(trace, run, tmp_path / "out.parquet"))
    recorded_order, own_order = compare_with_model(trace, run, out)
    assert own_order.first_index is None, own_order.to_dict()
    # the replay follows the program past the OOMs it survived: only the fatal one stops it
    handled = handled_rows(trace.events, trace.meta.extra)
    fatal = np.flatnonzero((trace.events.op == Op.OOM) & ~handled)
    other = _other_gpu(trace)
    if run.first_oom != (int(fatal[0]) if len(fatal) else -1) and other is not None:
        pytest.xfail(f"{other}; here the replay failed at row {run.first_oom}, the recording at "
                     f"{int(fatal[0]) if len(fatal) else None}")
    assert run.first_oom == (int(fatal[0]) if len(fatal) else -1)
    assert run.handled_ooms <= int(handled.sum())
    if recorded_order.first_index is not None and path.stem in ADDRESS_ORDER:  # the rest was checked above
        pytest.xfail(ADDRESS_ORDER[path.stem])
    if recorded_order.first_index is not None and other is not None:
        pytest.xfail(f"{other}; from request {recorded_order.first_index} on")
    assert recorded_order.first_index is None, recorded_order.to_dict()
    # the real allocator also reproduces the recording itself
    req = replayed_requests(trace, run)
    dev, rec = device_reserved(trace, run), _recorded_reserved(trace)
    if run.torch.rebuilt is None:
        assert np.array_equal(dev[req], rec[req])


def test_settings_are_reset_between_replays() -> None:
    tuned = read_trace(ROOT / "traces" / "torch-tuned.parquet")
    train = read_trace(ROOT / "traces" / "torch-train.parquet")
    a = replay_torch_on_device(tuned, None, None, 0)
    assert a.torch.settings.get("max_split_size") == 128 << 20
    b = replay_torch_on_device(train, "expandable_segments:True", None, 0)
    assert b.torch.settings.get("expandable_segments") is True
    c = replay_torch_on_device(train, None, None, 0)
    assert not c.torch.settings.get("expandable_segments")
    assert c.torch.settings.get("max_split_size") in (-1, (1 << 64) - 1, sys.maxsize * 2 + 1)


def test_capacity_is_the_exact_per_process_limit() -> None:
    trace = read_trace(ROOT / "traces" / "torch-oom.parquet")
    limit = trace.meta.pool_limit_bytes
    run = replay_torch_on_device(trace, None, limit, 0)
    assert run.ooms == 1 and trace.events.seq[run.first_oom] == 20175
    assert run.peak_reserved is not None and run.peak_reserved <= limit
    lifted = replay_torch_on_device(trace, None, None, 0, continue_on_oom=True)
    assert lifted.ooms == 0


def test_capacity_above_free_memory_is_refused_before_anything_is_taken() -> None:
    trace = read_trace(ROOT / "traces" / "torch-record-oom.parquet")
    start = _free()
    with pytest.raises(UsageError, match="more than the device's free memory"):
        replay_torch_on_device(trace, None, 1 << 50, 0)
    assert _free() == start


def test_cli_compare_sim_torch_and_output(tmp_path: Path) -> None:
    out = tmp_path / "replay.parquet"
    cmd = [sys.executable, "-m", "tracekit", "replay", str(ROOT / "traces" / "torch-train.parquet"),
           "--device", "0", "--allocator", "torch", "--compare-sim", "torch", "--json", "-o", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["device"]["released"] is True and doc["policy"] == "torch"
    assert doc["compare_sim"]["agree"] is True, doc["compare_sim"]
    assert all(c["first_index"] is None for c in doc["compare_sim"]["reserved"])
    replayed = read_trace(out)
    assert replayed.meta.extra["torch_allocator_settings"]["expandable_segments"] is False
    assert int(np.count_nonzero(replayed.events.op == Op.SEGMENT_ALLOC)) == doc["segment_allocs"]
    lat = replayed.extras.column("latency_ns").to_numpy(zero_copy_only=False)
    assert np.nanmin(lat[replayed.events.op == Op.MALLOC]) >= 0


def test_fail_on_oom_exits_3_and_gives_everything_back() -> None:
    start = _free()
    cmd = [sys.executable, "-m", "tracekit", "replay", str(ROOT / "traces" / "torch-record-oom.parquet"),
           "--device", "0", "--allocator", "torch", "--fail-on-oom"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 3, r.stderr
    assert "ran out of memory" in r.stderr
    assert _free() == start


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory) -> dict[str, Path]:
    from tracekit.synth import Pattern, synthesize

    d = tmp_path_factory.mktemp("synth")
    return {p.value: synthesize(p, 30_000, 7, d / f"{p.value}.parquet") for p in Pattern}


@pytest.mark.parametrize("name", ["training", "random", "fragmenting"])
def test_synthetic_traces_agree_with_the_model_on_this_devices_addresses(synthetic, name: str,
                                                                         tmp_path: Path) -> None:
    from tracekit.device.command import write_output

    trace = read_trace(synthetic[name])
    run = replay_torch_on_device(trace, None, None, 0)
    assert run.free_end == run.free_start and run.ooms == 0
    assert np.all(run.latency[run.status == 1] >= 0)
    out = read_trace(write_output(trace, run, tmp_path / "out.parquet"))
    _, on_device = compare_with_model(trace, run, out)
    assert on_device.first_index is None, on_device.to_dict()


def test_a_fresh_process_gets_every_byte_back_twice() -> None:
    """The first replay of a process also makes PyTorch's stream pool; that happens before the
    free memory is measured, so both replays come back to their start to the byte."""
    code = (
        "from tracekit.device.torch_replay import replay_torch_on_device\n"
        "from tracekit.trace import read_trace\n"
        "t = read_trace('traces/torch-train.parquet')\n"
        "for _ in range(2):\n"
        "    r = replay_torch_on_device(t, None, None, 0)\n"
        "    print(r.free_start - r.free_end)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["0", "0"]
