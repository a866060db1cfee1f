"""The device budget at the OOM moment beside the budget at start, and who took the memory.

Term by term, as ``tracekit budget`` prints it (bytes; each figure says how it was had):

- device total T: cudaMemGetInfo total (measured);
- other processes: NVML used memory per pid, at start (the recorder's budget) and at the
  OOM (``oom_states``) (measured);
- this process outside the pool = NVML used by this process − pool reserved (at start: the
  context, measured; at the OOM: derived), of which
  - local memory ≈ stack limit × threads the device holds, threads = SM count × max
    resident threads per SM (estimated; on the H200 a launch that raised the stack limit
    from 1 KiB to 16 KiB took exactly (16384 − 1024) B × 132 × 2048 = 3,960 MiB);
  - device malloc heap and printf FIFO: their ``cudaLimit`` sizes (estimated);
  - code, constants, driver: the rest (derived);
- the pool's reserved and live bytes (measured by the pool's counters at the OOM, else
  derived from the trace's own rows);
- free: cudaMemGetInfo at the OOM (measured). Without it, free at start − the pool's growth
  since is *derived*: it assumes nothing else took memory, so it is never shown as the
  device's free memory;
- unaccounted = T − every term above (derived).

Where the stack limit grew, the device free measured at device-level rows places the
growth: the interval between two measured rows with the largest drop in free that the
pool's own growth does not explain, (free_a − free_b) − (reserved_b − reserved_a).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import numpy as np

from tracekit.analysis.recording import OOMState, StartState
from tracekit.units import format_size as fs

MiB = 1 << 20


class How(StrEnum):
    MEASURED = "measured"
    ESTIMATED = "estimated"
    DERIVED = "derived"


class FreeSource(StrEnum):
    MEASURED = "measured"
    DERIVED = "derived"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class Term:
    """One row: a figure at start and at the OOM; ``level`` 1 = a part of the row above."""

    name: str
    start: int | None
    oom: int | None
    how_start: How
    how_oom: How
    why: str
    level: int = 0

    @property
    def change(self) -> int | None:
        return None if self.start is None or self.oom is None else self.oom - self.start

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "start_bytes": self.start, "oom_bytes": self.oom,
                "change_bytes": self.change, "how_start": self.how_start.value,
                "how_oom": self.how_oom.value, "why": self.why, "level": self.level}


@dataclass(frozen=True)
class Moment:
    """What is known at one OOM row of one device (bytes; None = unknown).

    ``points``: the measured device-free rows of the device before the OOM, as
    (seq, free, pool reserved after the row) arrays.
    """

    seq: int
    reserved: int
    live: int
    start: StartState | None
    state: OOMState | None
    column_free: int | None
    points: tuple[np.ndarray, np.ndarray, np.ndarray]


@dataclass(frozen=True, eq=False)
class OOMBudget:
    """The terms, the free figure and its source, and the sentence naming the takers.

    ``moment``: what the terms were computed from (the measured state at the OOM, the
    start, the measured rows), for a consumer that needs more than the figures
    (``tracekit advise`` derives its overhead cures from it).
    """

    terms: tuple[Term, ...]
    free: int | None
    free_source: FreeSource
    free_why: str
    takers: str  # "…; process 4242 (python) holds 133.80 GiB (measured; the largest taker)", or ""
    moment: Moment | None = None

    def term(self, name: str) -> Term | None:
        """The term called ``name`` (the first one), or None."""
        return next((t for t in self.terms if t.name == name), None)

    def to_dict(self) -> dict[str, Any]:
        """Every term, also those unknown at both moments (``null``), so the keys are fixed."""
        return {"terms": [t.to_dict() for t in self.terms], "free_bytes": self.free,
                "free_source": self.free_source.value, "free_why": self.free_why, "takers": self.takers}

    def rows(self) -> list[tuple[str, str]]:
        """Text rows: name, then start → OOM (change) and how."""
        out = []
        for t in self.terms:
            if t.start is None and t.oom is None:
                continue
            ch = f" ({'+' if (t.change or 0) >= 0 else '-'}{fs(abs(t.change))})" if t.change else ""
            how = t.how_oom.value if t.how_start == t.how_oom else f"{t.how_start.value} / {t.how_oom.value}"
            out.append(("  " * t.level + t.name, f"{fs(t.start)} -> {fs(t.oom)}{ch}  [{how}] {t.why}"))
        return out


def _stack(n: int) -> str:
    return f"{n // 1024} KiB" if n % 1024 == 0 else f"{n} B"


def _free(m: Moment, pool0: int) -> tuple[int | None, FreeSource, str]:
    if m.state is not None and m.state.mem_free is not None:
        return m.state.mem_free, FreeSource.MEASURED, "cudaMemGetInfo at the OOM"
    if m.column_free is not None:
        return m.column_free, FreeSource.MEASURED, "device_free recorded at the oom row"
    if m.start is not None and m.start.free is not None:
        return (m.start.free - (m.reserved - pool0), FreeSource.DERIVED,
                "free at start - the pool's growth since; misses anything else that took memory")
    return None, FreeSource.UNKNOWN, "not recorded"


def _sub(a: int | None, *bs: int | None) -> int | None:
    if a is None or any(b is None for b in bs):
        return None
    return a - sum(b for b in bs if b is not None)


def _mul(a: int | None, b: int | None) -> int | None:
    return None if a is None or b is None else a * b


def oom_budget(m: Moment) -> OOMBudget:
    """The budget at start and at the OOM (see the module docstring) and the takers' sentence."""
    st, s = m.start or StartState(), m.state
    pool0 = st.pool_total or 0
    free, source, free_why = _free(m, pool0)
    measured_pool = s is not None and s.pool_total is not None
    pool1 = s.pool_total if s is not None and s.pool_total is not None else m.reserved
    live1 = s.pool_used if s is not None and s.pool_used is not None else m.live
    pool_how = How.MEASURED if measured_pool else How.DERIVED
    pool_start = How.MEASURED if st.pool_total is not None else How.DERIVED  # else: the trace starts empty
    total1 = s.mem_total if s is not None and s.mem_total is not None else st.total
    others1 = None if s is None or s.processes is None else sum(p.used for p in s.others)
    self_used = s.self_used if s is not None else None
    outside1 = _sub(self_used, pool1)
    lim0, lim1 = st.limits, (s.limits if s is not None else st.limits)
    threads = st.threads
    local0, local1 = _mul(lim0.stack_size, threads), _mul(lim1.stack_size, threads)
    parts0 = (local0, lim0.malloc_heap_size, lim0.printf_fifo_size)
    parts1 = (local1, lim1.malloc_heap_size, lim1.printf_fifo_size)
    free_how = How.MEASURED if source is FreeSource.MEASURED else How.DERIVED
    E, M, D = How.ESTIMATED, How.MEASURED, How.DERIVED
    model = (f"stack limit x {st.threads_per_sm} threads/SM x {st.sm_count} SMs" if threads
             else "device properties not recorded")
    terms = [
        Term("device total", st.total, total1, M, M, "cudaMemGetInfo total"),
        Term("other processes", st.others_bytes, others1, M, M, "NVML used memory of other processes"),
        *_process_rows(st, s),
        Term("this process outside the pool", st.context, outside1, M, D,
             "at start: the CUDA context; at the OOM: NVML used by this process - pool reserved"),
        Term("local memory (model)", local0, local1, E, E, model, 1),
        Term("device malloc heap", lim0.malloc_heap_size, lim1.malloc_heap_size, E, E,
             "cudaLimitMallocHeapSize", 1),
        Term("printf FIFO", lim0.printf_fifo_size, lim1.printf_fifo_size, E, E, "cudaLimitPrintfFifoSize", 1),
        Term("code, constants, driver (rest)", _sub(st.context, *parts0), _sub(outside1, *parts1), D, D,
             "the row above - the three estimates", 1),
        Term("pool reserved", pool0, pool1, pool_start, pool_how,
             "the pool's counters" if measured_pool else "sum of live segments in the trace"),
        Term("pool live", st.pool_used or 0, live1, pool_start, pool_how, "bytes in use in the pool", 1),
        Term("free", st.free, free, M, free_how, free_why),
        Term("unaccounted", _sub(st.total, st.others_bytes, st.context, pool0, st.free),
             _sub(total1, others1, outside1, pool1, free), D, D, "device total - every term above"),
    ]
    return OOMBudget(tuple(terms), free, source, free_why, _takers(m, st, s, pool1, outside1), m)


def _process_rows(st: StartState, s: OOMState | None) -> list[Term]:
    start = {p.pid: p for p in st.others or ()}
    now = {p.pid: p for p in (s.others if s is not None else ())}
    rows = []
    for pid in sorted(start.keys() | now.keys(), key=lambda p: -(now[p].used if p in now else 0)):
        p = now.get(pid) or start[pid]
        b0 = start[pid].used if pid in start else (0 if st.others is not None else None)
        b1 = now[pid].used if pid in now else (0 if s is not None and s.processes is not None else None)
        rows.append(Term(p.label(), b0, b1, How.MEASURED, How.MEASURED, "NVML per-process used", 1))
    return rows


def _takers(m: Moment, st: StartState, s: OOMState | None, pool1: int, outside1: int | None) -> str:
    """What changed since start (largest first), each placed between two measured rows where
    the device free shows it, and the largest taker at the OOM."""
    if s is None:
        return ""
    drops = _drops(m, st)
    changes: list[tuple[int, str, str]] = []  # (bytes, key, phrase)
    pool_how = "measured" if s.pool_total is not None else "derived"
    held: list[tuple[int, str, str]] = [(pool1, "pool", f"the pool holds {fs(pool1)} ({pool_how})")]
    s0, s1, threads = st.limits.stack_size, s.limits.stack_size, st.threads
    if s0 is not None and s1 is not None and threads and s1 != s0:
        grew = (s1 - s0) * threads
        verb = "grew" if grew > 0 else "shrank"
        changes.append((abs(grew), "local", f"the stack limit {verb} from {_stack(s0)} to {_stack(s1)} per "
                        f"thread {_between(drops, grew, m.seq)}, reserving ≈ {fs(abs(grew))} "
                        f"{'more' if grew > 0 else 'less'} for local memory (estimated: {s1 - s0:+,} B x "
                        f"{threads:,} threads)"))
    if s1 is not None and threads:
        held.append((s1 * threads, "local", f"local memory holds ≈ {fs(s1 * threads)} (estimated)"))
    start = {p.pid: p.used for p in st.others or ()}
    for p in s.others:
        key = f"pid {p.pid}"
        held.append((p.used, key, f"{p.label()} holds {fs(p.used)} (measured)"))
        was = start.get(p.pid, 0)
        if st.others is not None and p.used - was >= MiB:
            what = f"grew by {fs(p.used - was)} to {fs(p.used)} (measured)" if was else \
                f"started using the device after recording began, {_between(drops, p.used, m.seq)}, and " \
                f"holds {fs(p.used)} (measured)"
            changes.append((p.used - was, key, f"{p.label()} {what}"))
    for name, a, b in (("device malloc heap", st.limits.malloc_heap_size, s.limits.malloc_heap_size),
                       ("printf FIFO", st.limits.printf_fifo_size, s.limits.printf_fifo_size)):
        if a is not None and b is not None and b != a:
            changes.append((abs(b - a), name, f"the {name} limit changed from {fs(a)} to {fs(b)} "
                            f"{_between(drops, b - a, m.seq)}"))
    changes.sort(key=lambda c: -c[0])
    top = max(held, key=lambda h: h[0])
    phrases = [_largest(c[2]) if c[1] == top[1] else c[2] for c in changes]
    if top[1] not in {c[1] for c in changes}:
        phrases.append(_largest(top[2]))
    return "; ".join(phrases)


def _largest(phrase: str) -> str:
    """``phrase`` marked as the largest taker, inside its closing "(how)" where it has one."""
    return phrase[:-1] + "; the largest taker)" if phrase.endswith(")") else phrase + " (the largest taker)"


def _drops(m: Moment, st: StartState) -> tuple[np.ndarray, np.ndarray]:
    """(seq of each measured row, -1 = the start; the drop in free since the row before that
    the pool's own growth does not explain), from the start to the OOM."""
    seq, free, res = m.points
    if m.state is not None and m.state.mem_free is not None and (len(seq) == 0 or seq[-1] != m.seq):
        seq, free, res = np.r_[seq, m.seq], np.r_[free, m.state.mem_free], np.r_[res, m.reserved]
    if st.free is not None:
        seq, free, res = np.r_[-1, seq], np.r_[st.free, free], np.r_[st.pool_total or 0, res]
    return seq, (free[:-1] - free[1:]) - (res[1:] - res[:-1])


@dataclass(frozen=True)
class Drop:
    """A fall in device free between two measured rows that the pool's own growth does not
    explain: (free_a − free_b) − (reserved_b − reserved_a), bytes; ``after`` -1 = the start."""

    after: int
    before: int
    bytes: int


def placed_drop(drops: tuple[np.ndarray, np.ndarray], amount: int) -> Drop | None:
    """The interval whose unexplained drop is closest to ``amount``, if within half of it."""
    seq, drop = drops
    if len(drop) and abs(amount) < 1 << 62:  # beyond any device: no interval can show it
        i = int(np.argmin(np.abs(drop - abs(amount))))
        if abs(int(drop[i]) - abs(amount)) <= abs(amount) // 2:
            return Drop(int(seq[i]), int(seq[i + 1]), int(drop[i]))
    return None


def moment_drop(m: Moment, amount: int) -> Drop | None:
    """``placed_drop`` over the measured rows of the moment (start to OOM)."""
    return placed_drop(_drops(m, m.start or StartState()), amount)


def _between(drops: tuple[np.ndarray, np.ndarray], amount: int, oom_seq: int) -> str:
    """"between seq A and seq B": the interval whose unexplained drop is closest to ``amount``
    (within half of it); else the whole span before the OOM."""
    d = placed_drop(drops, amount)
    if d is not None:
        a = "the start" if d.after < 0 else f"seq {d.after}"
        return (f"between {a} and seq {d.before} (where free fell by {fs(d.bytes)} more "
                "than the pool took, measured)")
    return f"between the start and the OOM at seq {oom_seq}"
