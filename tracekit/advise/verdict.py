"""Whether a setting fits: the one decision that ``advise`` (table, ``--json``, recommendation),
``report`` and ``--rerun`` show.

A replay says whether a setting gets through the recorded requests and at what peak reserved
(bytes). A real run of the same program under that setting can peak higher than the replay for
two reasons the trace cannot settle: the program reacts to memory (cuDNN tries a smaller
workspace after an OOM and keeps that algorithm; a caller retries smaller), or it picks its
requests at run time (``cudnn.benchmark`` times algorithms, and with them the workspaces it asks
for, differently from run to run). ``MODEL_ERRORS`` is the largest amount by which a real run's
peak reserved exceeded the prediction, measured on the H200 (``docs/fidelity.md``, the fixtures
in ``traces/fidelity/``; ``tests/fidelity/test_real_runs.py`` checks every figure against them),
per allocator and ``Workload``. A setting's ``Verdict``:

- ``FITS``: the replay gets through and its headroom (limit − peak reserved) exceeds the margin;
- ``BORDERLINE``: it gets through, but with a headroom of at most the margin (0 included): a
  real run may not; ``advise --rerun`` settles it. Also every setting that gets through when the
  recorded setting itself replays through the recorded failure (``Margin.explains`` False): the trace
  then does not explain that failure, and no headroom in it is evidence;
- ``NO``: the replay fails, or its peak reserved is above the limit;
- ``ERROR``: the setting could not be replayed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import numpy as np

from tracekit.sim.base import Allocator
from tracekit.trace.outcome import handled_rows
from tracekit.trace.reader import Trace
from tracekit.trace.schema import Op
from tracekit.units import format_size

PAGE = 2 << 20  # one device page: no model is closer than the driver's granularity
CONV_FILE = "torch/nn/modules/conv.py"  # a request made here is a cuDNN convolution's


class Verdict(StrEnum):
    FITS = "fits"
    BORDERLINE = "borderline"
    NO = "no"
    ERROR = "error"


class Workload(StrEnum):
    """How much a real run's requests can differ from the recorded ones."""

    STEADY = "steady"  # the requests do not depend on memory: the replay is the run
    REACTIVE = "reactive"  # handled OOMs or run-time workspace choices: a real run may ask more


@dataclass(frozen=True)
class ModelError:
    """The largest measured excess of a real run's peak reserved over the prediction, as a
    fraction of the limit (``fraction``), for ``allocator`` ("raw": a simulated heap) on ``workload``."""

    allocator: str
    workload: Workload
    fraction: float
    floor: int  # bytes: the least margin (a device page where the allocator maps pages)
    measured: str  # where the figure comes from


MODEL_ERRORS: tuple[ModelError, ...] = (
    # GPT-2 (transformers), 14 settings run for real: largest excess 12.6 MB of an 8.37 GiB limit
    # (0.14 %); torch-oom's 8 counterfactual runs: none above their prediction.
    ModelError(Allocator.TORCH, Workload.STEADY, 0.002, PAGE, "GPT-2 and the transformer LM, 22 real runs"),
    # ResNet-50 (cudnn.benchmark, handled cuDNN OOMs), 21 + the later caps' settings run for real:
    # largest excess 65.5 MB of a 4.19 GiB limit (1.45 %).
    ModelError(Allocator.TORCH, Workload.REACTIVE, 0.02, PAGE,
               "ResNet-50 with cuDNN fallbacks, real runs at two caps"),
    # CuPy's pool: every counterfactual run exact to the byte (docs/fidelity.md): any headroom above 0.
    ModelError(Allocator.CUPY, Workload.STEADY, 0.0, 0, "the CuPy oom workload at three set_limit values"),
    # No CuPy program with handled OOMs was run under other settings: PyTorch's reactive figure.
    ModelError(Allocator.CUPY, Workload.REACTIVE, 0.02, PAGE,
               "not measured for CuPy: PyTorch's reactive figure"),
    # RMM's pool against its real PoolMemoryResource on two real programs' logs (traces/fidelity/rmm.json):
    # 28 maxima exact; scanning up, one maximum where the model gets through 6 MiB (1.4 % of it)
    # below RMM's first fit. 2 % covers that; no program was run for real under another maximum.
    ModelError(Allocator.RMM_POOL, Workload.STEADY, 0.02, PAGE,
               "RMM's real pool on two programs' logs: 28 maxima exact, one 1.4 % optimistic"),
    ModelError(Allocator.RMM_POOL, Workload.REACTIVE, 0.02, PAGE,
               "RMM's real pool on two programs' logs: 28 maxima exact, one 1.4 % optimistic"),
)


@dataclass(frozen=True)
class Margin:
    """The headroom a setting needs to be called ``FITS``: ``fraction`` of its capacity, at least
    ``floor`` bytes. ``why`` says what the workload is and where the figure was measured."""

    workload: Workload
    fraction: float
    floor: int
    why: str
    explains: bool = True  # False: the recorded setting's replay gets through where the run failed

    def bytes_at(self, capacity: int) -> int:
        return max(self.floor, int(self.fraction * capacity))

    @property
    def exact(self) -> bool:
        """No margin: the model is the allocator (a simulated heap) or was exact on every real run
        (CuPy's pool): any headroom above 0 fits (0 itself is borderline: a model of a device
        allocator, such as MemoryAsyncPool's, is optimistic at the limit)."""
        return self.fraction == 0 and self.floor == 0

    def sentence(self, capacity: int) -> str:
        if self.exact:
            return f"margin 0 (any headroom above 0): {self.why}"
        return (f"margin {format_size(self.bytes_at(capacity))} ({self.fraction:.1%} of the limit, at least "
                f"{format_size(self.floor)}): {self.why}")


def workload_of(trace: Trace, kind: str | None = None) -> tuple[Workload, str]:
    """The trace's workload kind and the reason, in words; ``kind``: the allocator it is replayed
    through (a PyTorch trace without call-sites cannot show it holds no cuDNN convolution: reactive)."""
    ev = trace.events
    handled = int(np.count_nonzero(handled_rows(ev, trace.meta.recorded)))
    if handled:
        return Workload.REACTIVE, (f"the program survived {handled} OOM(s) and asked for something else "
                                   "instead (a smaller workspace, a retry), so a run under another setting "
                                   "may ask more")
    if any(s.split(":", 1)[0].endswith(CONV_FILE) for s in ev.sites):
        return Workload.REACTIVE, ("cuDNN convolutions choose their workspaces at run time "
                                   "(cudnn.benchmark times them), so a real run's requests vary")
    if kind == Allocator.TORCH and not np.any(ev.site[ev.op == Op.MALLOC] >= 0):
        return Workload.REACTIVE, ("the trace holds no call-sites, so whether cuDNN chooses workspaces at "
                                   "run time cannot be told: the margin of a reactive workload is kept")
    return Workload.STEADY, "the program's requests do not depend on memory"


def margin_for(kind: str, trace: Trace) -> Margin:
    """The margin of ``trace`` replayed through ``kind``'s allocator ("raw": a simulated heap,
    which is the allocator itself: any headroom above 0 fits)."""
    workload, reason = workload_of(trace, kind)
    err = next((e for e in MODEL_ERRORS if e.allocator == kind and e.workload == workload), None)
    if err is None:
        return Margin(workload, 0.0, 0, "a simulated heap is the allocator itself")
    return Margin(workload, err.fraction, err.floor, f"{reason}; measured on the H200: {err.measured}")


def decide(fits: bool, error: str | None, headroom: int | None, capacity: int | None,
           margin: Margin) -> Verdict:
    """The verdict of one replayed setting (see the module docstring)."""
    if error is not None:
        return Verdict.ERROR
    if not fits:
        return Verdict.NO
    if headroom is None or capacity is None:  # no limit: nothing to run out of
        return Verdict.FITS
    if headroom < 0:
        return Verdict.NO
    if not margin.explains:  # the model does not reproduce the recorded failure: no headroom is evidence
        return Verdict.BORDERLINE
    return Verdict.FITS if headroom > margin.bytes_at(capacity) else Verdict.BORDERLINE


WORDS = {Verdict.FITS: "yes", Verdict.BORDERLINE: "borderline", Verdict.NO: "no", Verdict.ERROR: "error"}
ORDER = {Verdict.FITS: 0, Verdict.BORDERLINE: 1, Verdict.NO: 2, Verdict.ERROR: 3}


def verdict_rows(d: Mapping[str, Any]) -> list[tuple[Mapping[str, Any], str]]:
    """The tried settings of ``advise --json`` output ``d`` (``AdviseDict``), best verdict first, each with
    the word its verdict is shown as: the verdict is advise's, never recomputed by a reporter."""
    tried: Sequence[Mapping[str, Any]] = d["tried"]
    rows = sorted(tried, key=lambda r: (ORDER[Verdict(r["verdict"])], r["peak_reserved_bytes"]))
    return [(r, WORDS[Verdict(r["verdict"])]) for r in rows]
