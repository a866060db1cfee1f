"""``--compare-sim torch`` for a replay through PyTorch's allocator: reserved bytes, request by request.

Two model runs are compared with the device, after every request the device
replayed (reserved bytes = device memory the allocator held, from its own
segment events):

- ``trace``: the ``torch`` model on the input trace, under the same settings
  and limit: exactly what ``replay --sim torch`` says. Where the model breaks
  ties between equal free blocks by address it uses the recorded addresses;
- ``device``: the model on the replay's own output trace, whose segment rows
  carry the addresses this device gave. Ties then fall as they did here, so a
  difference is the model's, not the address layout's.

Each yields a ``ReservedComparison`` (first differing request, its seq and both
values). No PyTorch is needed: this runs on the ``DeviceRun`` and the output.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tracekit.device.compare import ReservedComparison, compare_reserved, reserved_by_request
from tracekit.device.replay import DeviceRun
from tracekit.device.result import initial_rows
from tracekit.sim import policies
from tracekit.sim.base import Allocator, SimConfig, Status
from tracekit.trace.reader import Trace
from tracekit.trace.schema import Op


def _model(trace: Trace, run: DeviceRun) -> Any:
    from tracekit.sim.engine import replay

    cfg = SimConfig(capacity=run.config.capacity, continue_on_oom=run.config.continue_on_oom,
                    options=dict(run.torch.options))
    return replay(trace, policies.modelling(Allocator.TORCH), cfg)


def replayed_requests(trace: Trace, run: DeviceRun) -> np.ndarray:
    """Input indices of the requests the device replayed (placed, freed or failed; not the starting state)."""
    ev = trace.events
    req = (ev.op == Op.MALLOC) | (ev.op == Op.FREE) | (ev.op == Op.OOM)
    ran = (run.status == Status.DONE) | (run.status == Status.OOM)
    return np.flatnonzero(req & ran & ~initial_rows(trace))


def device_reserved(trace: Trace, run: DeviceRun) -> np.ndarray:
    """The device's reserved bytes after each input event (from its segment rows)."""
    return reserved_by_request(len(trace.events), np.asarray(run.rows.before), np.asarray(run.rows.op),
                               np.asarray(run.rows.size))


def compare_with_model(trace: Trace, run: DeviceRun, output: Trace | None = None) -> list[ReservedComparison]:
    """The device against the model on the input trace and, given the output trace, on the output."""
    requests = replayed_requests(trace, run)
    dev = device_reserved(trace, run)
    n = len(trace.events)
    m = _model(trace, run).run
    model = reserved_by_request(n, m.rows_before, m.rows_op, m.rows_size)
    out = [compare_reserved(trace, requests, dev, model, "model, recorded addresses")]
    if output is not None:
        out.append(compare_reserved(trace, requests, dev, _model_on_output(trace, run, output),
                                    "model, this device's addresses"))
    return out


def _model_on_output(trace: Trace, run: DeviceRun, output: Trace) -> np.ndarray:
    """The model's reserved bytes after each input event, replaying the device's output trace."""
    m = _model(output, run).run
    res_out = reserved_by_request(len(output.events), m.rows_before, m.rows_op, m.rows_size)
    tbl = output.extras
    res = np.full(len(trace.events), -1, np.int64)
    if tbl is None or "input_seq" not in tbl.column_names:
        return res
    col = tbl.column("input_seq")
    rows = np.flatnonzero(np.asarray(col.is_valid().to_numpy(zero_copy_only=False), bool))
    seqs = np.asarray(col.fill_null(0).to_numpy(zero_copy_only=False), np.uint64)[rows]
    idx = np.searchsorted(trace.events.seq, seqs)
    res[idx] = res_out[rows]
    return res
