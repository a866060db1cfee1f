"""``advise --rerun N``: the recorded program run again for real under the N best settings.

What "verified" means for the real program: each setting's run is itself recorded
(``tracekit record``, the same arguments in the same folder, from the trace's ``rerun``
metadata; older traces: parsed from ``command``, in the current folder), with the
setting applied the way a user would apply it:

- a PyTorch setting through ``PYTORCH_CUDA_ALLOC_CONF`` (the recorded program sets its own
  memory fraction again, or ``record --torch --limit`` does as it did when recorded);
- CuPy's pool at the recorded limit, or a raised ``set_limit``, through ``record --limit``;
- every other candidate (``free_all_blocks()`` at a call-site, ``MemoryAsyncPool``, plain
  ``cudaMalloc``, an overhead cure) needs a change to the program: listed, not run; so does every
  setting of a pool the program made itself (``PoolScope``: ``record --limit`` sets the default
  pool's limit alone, and a run under it would fail where the recording did).

Each run gets a fresh folder's file (``DIR/rerun-K.parquet``; ``DIR`` defaults to a new folder
beside the trace, never an existing one), its output in ``rerun-K.log``, and at most
``timeout`` seconds (then SIGTERM, which still writes its trace, and SIGKILL 30 s later).

The real outcome, beside the prediction: whether it finished (exit 0), its peak reserved (the trace's
device allocations; where advise replayed the default pool's rows alone, ``run.default_rows``, that
pool's in the rerun too, so the two peaks are of the same memory), and whether it **got past the
recorded failing request**. That request is named by its whole stack, its size and how many requests of
that stack and size came before it (a program that reacts to memory makes a different number of other
requests: cuDNN's workspace attempts): the rerun got past it when it died of no OOM, or when its request
of that ordinal was served or survived; not when that request failed fatally. A rerun that never made
that request (a trace without stacks, a workspace of another size) got past it when it made more
``malloc`` requests before its fatal OOM than the recording made before its own.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import TypedDict

import numpy as np

from tracekit.advise.candidates import Kind, PoolScope, conf_text
from tracekit.advise.evaluate import Outcome
from tracekit.advise.verdict import ORDER, Verdict
from tracekit.errors import UsageError
from tracekit.sim.base import Allocator
from tracekit.trace.events import segment_delta
from tracekit.trace.outcome import default_pool, fatal_row, pool_limit_of
from tracekit.trace.reader import Trace, read_trace
from tracekit.trace.schema import Op

RUNNABLE = frozenset({Kind.TORCH_CONF, Kind.CUPY_POOL, Kind.CUPY_LIMIT})
KILL_AFTER_S = 30.0


@dataclass(frozen=True)
class Command:
    """How the recorded program is run again: ``record``'s target, module or script, and folder."""

    argv: tuple[str, ...]
    module: bool
    cwd: str
    torch: bool
    limit: int | None  # ``record --limit`` it was recorded under
    guessed: bool  # from ``command`` text and the current folder (a trace without ``rerun``)

    @classmethod
    def of(cls, trace: Trace, kind: str) -> Command:
        rerun = trace.meta.recorded.rerun
        torch = kind == Allocator.TORCH
        if rerun is not None:
            return cls(rerun.argv, rerun.module, rerun.cwd or os.getcwd(), torch, rerun.limit_bytes, False)
        program = program_of(trace.meta.command)
        if program is None:
            where = f"{trace.path}: " if trace.path else ""
            raise UsageError(f"{where}the trace does not say how the program was run (no command recorded), "
                             "so --rerun cannot run it again")
        argv, module = program
        return cls(argv, module, os.getcwd(), torch, None, True)


# ``tracekit record``'s options that capture a trace of each recorded kind (an ``Allocator``); a
# kind not here (raw: synthetic or imported traces) is not recorded by ``tracekit record``
RECORD_OPTIONS: dict[str, tuple[str, ...]] = {Allocator.TORCH: ("--torch",), Allocator.CUPY: (),
                                              Allocator.RMM_POOL: ("--rmm",)}


def program_words(trace: Trace) -> tuple[str, ...] | None:
    """The recorded program as ``record``'s target words (``-m MODULE ARGS`` or ``SCRIPT ARGS``): the
    recorder's ``rerun`` where the trace has it, else its ``python ...`` command; None: neither."""
    rerun = trace.meta.recorded.rerun
    if rerun is not None:
        return ("-m",) * rerun.module + rerun.argv
    got = program_of(trace.meta.command)
    return None if got is None else ("-m",) * got[1] + got[0]


def program_of(command: str | None) -> tuple[tuple[str, ...], bool] | None:
    """A recorded ``python SCRIPT ARGS`` or ``python -m MODULE ARGS`` command line as the program's
    words (script or module first) and whether it ran as a module; None where it is not one."""
    try:
        words = shlex.split(command or "")
    except ValueError:  # unbalanced quotes: no command line a shell would take
        return None
    if len(words) < 2 or not PurePosixPath(words[0]).name.startswith("python"):
        return None
    module = words[1] == "-m"
    return tuple(words[2:] if module else words[1:]), module


class RerunDict(TypedDict):
    """One entry of ``reruns`` in ``advise --json``."""

    setting: str
    predicted: str
    predicted_peak_reserved_bytes: int
    ran: bool
    note: str
    exit_code: int | None
    timed_out: bool
    got_past_failing_request: bool | None
    finished: bool | None
    real_peak_reserved_bytes: int | None
    real_ooms: int | None
    agrees: bool | None
    trace: str | None
    seconds: float | None
    limit_asked_bytes: int | None
    limit_held_bytes: int | None
    overridden: bool


@dataclass(frozen=True)
class Rerun:
    """One setting run for real (``ran``) or why not (``note``); bytes unless named otherwise."""

    setting: str
    predicted: Verdict
    predicted_peak: int
    ran: bool
    note: str = ""
    exit_code: int | None = None
    timed_out: bool = False
    got_past: bool | None = None  # None: the recording did not fail, nothing to get past
    finished: bool | None = None
    real_peak: int | None = None
    real_ooms: int | None = None
    trace: str | None = None
    seconds: float | None = None
    limit_asked: int | None = None  # record's --limit for the rerun
    limit_held: int | None = None  # the rerun's default pool's limit as the program left it (None: none)

    @property
    def overridden(self) -> bool:
        """The program set a limit of its own over record's ``--limit`` (or lifted it): it did not run
        under the setting (PyTorch's ±1-byte rounding of a fraction is not another limit)."""
        if self.limit_asked is None:
            return False
        return self.limit_held is None or abs(self.limit_held - self.limit_asked) > 1

    @property
    def agrees(self) -> bool | None:
        """A fit must get past the failing request (or finish), a no must not; borderline claims neither,
        nor does a run the program held to a limit of its own."""
        if not self.ran or self.overridden or self.predicted in (Verdict.BORDERLINE, Verdict.ERROR):
            return None
        real = self.got_past if self.got_past is not None else self.finished
        return None if real is None else real == (self.predicted == Verdict.FITS)

    def to_dict(self) -> RerunDict:
        return RerunDict(
            setting=self.setting, predicted=self.predicted.value,
            predicted_peak_reserved_bytes=self.predicted_peak,
            ran=self.ran, note=self.note, exit_code=self.exit_code, timed_out=self.timed_out,
            got_past_failing_request=self.got_past, finished=self.finished,
            real_peak_reserved_bytes=self.real_peak, real_ooms=self.real_ooms, agrees=self.agrees,
            trace=self.trace, seconds=self.seconds, limit_asked_bytes=self.limit_asked,
            limit_held_bytes=self.limit_held, overridden=self.overridden)


def choose(tried: Sequence[Outcome], n: int) -> tuple[list[Outcome], list[Outcome]]:
    """The ``n`` best re-runnable settings (fits, then borderline, then the rest by how far they
    got) and the better-rated ones that need a program change (listed, not run)."""
    rated = sorted(tried, key=lambda o: (ORDER[o.verdict or Verdict.NO], o.progress()))
    runnable = [o for o in rated
                if o.candidate.kind in RUNNABLE and not o.candidate.cures and o.error is None]
    chosen = runnable[:n]
    changes = [o for o in rated if o not in runnable and o.verdict in (Verdict.FITS, Verdict.BORDERLINE)]
    return chosen, changes


def new_folder(trace: Trace, given: Path | None) -> Path:
    """A folder made now for the reruns' files: ``given`` (must not exist) or ``TRACE.rerun[-K]``."""
    if given is not None:
        if given.exists():
            raise UsageError(f"--rerun-dir {given}: already exists; name a new folder "
                             "(nothing is overwritten)")
        given.mkdir(parents=True)
        return Path(os.path.abspath(given))
    base = Path(os.path.abspath(trace.path if trace.path else "trace.parquet"))  # said whole in the output
    stem = base.name.removesuffix(".parquet")
    for k in range(1000):
        d = base.with_name(f"{stem}.rerun" + (f"-{k}" if k else ""))
        try:
            d.mkdir()
            return d
        except FileExistsError:
            continue
    raise UsageError(f"{base}: no free name for the reruns' folder beside it")


def rerun(trace: Trace, kind: str, tried: Sequence[Outcome], n: int, *, folder: Path | None = None,
          timeout: float = 900.0, limit: int | None = None,
          pool: PoolScope | None = None, default_alone: bool = False,
          device: int = 0) -> tuple[Rerun, ...]:
    """Run the program under the ``n`` best settings (module docstring); ``limit``: advise's own
    ``--limit``, applied to PyTorch reruns with ``record --torch --limit``; ``pool``: the program's own
    pool advise answered for, whose settings are all changes to the program (none is run);
    ``default_alone``: advise replayed the default pool's rows alone, so each rerun's peak is that
    pool's, on ``device`` (advise's)."""
    if pool is not None:
        rated = sorted(tried, key=lambda o: (ORDER[o.verdict or Verdict.NO], o.progress()))
        why = (f"a setting of the program's own pool {pool.name()}, made in the program: record --limit "
               "sets the default pool's limit alone, so not re-runnable; run the program with the line")
        return tuple(Rerun(o.label(), o.verdict or Verdict.NO, o.peak_reserved, False, why)
                     for o in rated[:n] if o.error is None)
    cmd = Command.of(trace, kind)
    chosen, changes = choose(tried, n)
    out = [Rerun(o.label(), o.verdict or Verdict.NO, o.peak_reserved, False,
                 "needs a change to the program, not a setting: not re-runnable") for o in changes]
    if not chosen:
        return tuple(out)
    where = new_folder(trace, folder)
    need = FailingRequest.of(trace)
    for k, o in enumerate(chosen, 1):
        out.append(_run_one(cmd, o, where / f"rerun-{k}.parquet", need, timeout, limit,
                            device if default_alone else None))
    return tuple(out)


def _run_one(cmd: Command, o: Outcome, path: Path, need: FailingRequest | None, timeout: float,
             limit: int | None, default_of: int | None = None) -> Rerun:
    env = dict(os.environ)
    args = [sys.executable, "-m", "tracekit", "record", "-o", str(path)]
    if cmd.torch:
        args.append("--torch")
        env.pop("PYTORCH_ALLOC_CONF", None)  # PyTorch's newer name would win over the setting
        conf = conf_text(o.candidate.opts)
        if conf:
            env["PYTORCH_CUDA_ALLOC_CONF"] = conf
        else:
            env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
        cap = limit if limit is not None else cmd.limit
    else:
        cap = o.capacity if o.candidate.kind == Kind.CUPY_LIMIT else (cmd.limit or o.capacity)
    if cap is not None:
        args += ["--limit", str(cap)]
    args += (["-m"] if cmd.module else []) + list(cmd.argv)
    log = path.with_suffix(".log")
    t0 = time.perf_counter()
    timed_out = False
    with log.open("wb") as fh:
        p = subprocess.Popen(args, cwd=cmd.cwd, env=env, stdin=subprocess.DEVNULL, stdout=fh,
                             stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            code = _stop(p)
    secs = round(time.perf_counter() - t0, 1)
    guessed = ("the trace does not record how the program was started: run in the current folder, "
               "arguments from its command line") if cmd.guessed else ""
    base = Rerun(o.label(), o.verdict or Verdict.NO, o.peak_reserved, True, note=guessed, exit_code=code,
                 timed_out=timed_out, finished=code == 0, seconds=secs)
    if not path.exists():
        return replace(base, note=f"the rerun left no trace (see {log})")
    try:
        t = read_trace(path)
    except Exception as e:  # a rerun's trace that cannot be read is said, not raised
        return replace(base, note=f"the rerun's trace could not be read: {e}")
    got_past = past(need, t)
    # record --limit sets the default pool of the device the program starts on: that pool, as the
    # program left it (a killed rerun's entries do not say: the limit at the start, record's own)
    ran = replace(base, got_past=got_past, real_peak=real_peak_reserved(t, default_of), trace=str(path),
                  real_ooms=int(np.count_nonzero(t.events.op == Op.OOM)), limit_asked=cap,
                  limit_held=pool_limit_of(t.meta))
    if ran.overridden:  # a set_limit (or memory fraction) in the program, after record set its own
        held = f"a limit of its own ({ran.limit_held} bytes)" if ran.limit_held is not None else "no limit"
        said = (f"the program set {held} over record's --limit {cap}: it did not run under this "
                f"setting; change the limit where the program sets it")
        ran = replace(ran, note="; ".join(n for n in (ran.note, said) if n))
    return ran


def _stop(p: subprocess.Popen[bytes]) -> int:
    """SIGTERM to the run's process group (``record`` still writes its trace), SIGKILL if it lingers."""
    try:
        os.killpg(p.pid, signal.SIGTERM)
        return p.wait(timeout=KILL_AFTER_S)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        return p.wait()
    except ProcessLookupError:
        return p.wait()


@dataclass(frozen=True)
class FailingRequest:
    """The request a recording died of: its stack (frame labels, innermost first), size (bytes), its
    ordinal among the requests of that stack and size (1-based), and the ``malloc`` rows before it."""

    frames: tuple[str, ...]
    size: int
    ordinal: int
    mallocs_before: int

    @classmethod
    def of(cls, t: Trace) -> FailingRequest | None:
        row = _fatal_row(t)
        if row is None:
            return None
        ev = t.events
        frames = _frames(t, int(ev.stack[row]))
        same = _same_requests(t, frames, int(ev.size[row]))
        return cls(frames, int(ev.size[row]), int(np.count_nonzero(same <= row)),
                   int(np.count_nonzero(ev.op[:row] == Op.MALLOC)))


def past(failing: FailingRequest | None, t: Trace) -> bool | None:
    """Did the run recorded in ``t`` get past ``failing`` (None: the recording did not fail)?"""
    if failing is None:
        return None
    fatal = _fatal_row(t)
    if fatal is None:
        return True
    same = _same_requests(t, failing.frames, failing.size)
    if len(same) >= failing.ordinal:
        return int(same[failing.ordinal - 1]) != fatal  # served, or survived
    # The rerun never made that request (no stacks, or a workspace of another size): count requests.
    return int(np.count_nonzero(t.events.op[:fatal] == Op.MALLOC)) > failing.mallocs_before


def _fatal_row(t: Trace) -> int | None:
    return fatal_row(t.events, t.meta.recorded)


def _frames(t: Trace, stack: int, sites: object | None = None) -> tuple[str, ...]:
    """The frame labels of ``stack``, innermost first (``sites``: the trace's ``CallSites``, made once)."""
    if stack < 0:
        return ()
    from tracekit.trace.callsite import CallSites, stack_table

    cs = sites if isinstance(sites, CallSites) else CallSites.of(stack_table(t.events))
    return tuple(f.label() for f in cs.frames(stack))


def _same_requests(t: Trace, frames: tuple[str, ...], size: int) -> np.ndarray:
    """Rows of the requests (``malloc``, ``oom``) of ``size`` bytes whose stack has ``frames``."""
    ev = t.events
    rows = np.flatnonzero(((ev.op == Op.MALLOC) | (ev.op == Op.OOM)) & (ev.size == np.uint64(size)))
    if not len(rows) or not frames:
        return rows[:0]
    from tracekit.trace.callsite import CallSites, stack_table

    cs = CallSites.of(stack_table(ev))  # once: its frame roles cover the whole table
    stacks = np.unique(ev.stack[rows])
    mine = [s for s in stacks.tolist() if _frames(t, int(s), cs) == frames]
    return rows[np.isin(ev.stack[rows], np.asarray(mine, ev.stack.dtype))]


def real_peak_reserved(t: Trace, default_of: int | None = None) -> int:
    """A rerun's peak reserved bytes (``_peak_reserved``): those of device ``default_of``'s default pool
    alone where the prediction was of that pool's rows alone, else every pool's."""
    return _peak_reserved(t if default_of is None else _default_pool(t, default_of))


def _default_pool(t: Trace, device: int) -> Trace:
    """A rerun's rows of ``device``'s default pool (``outcome.default_pool``; ``t`` itself where the
    rerun names none): the memory a prediction on the default pool's rows alone is of."""
    from tracekit.trace.devices import select_pool

    default = default_pool(t.meta.recorded, device)
    return select_pool(t, default.id) if default is not None else t


def _peak_reserved(t: Trace) -> int:
    """The most bytes the trace's pools held from the device (segment rows), 0 without any."""
    return int(np.cumsum(segment_delta(t.events)).max(initial=0))
