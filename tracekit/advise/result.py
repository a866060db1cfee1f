"""The answer of ``tracekit advise``: what fits, the recommended line, or how far from fitting.

``rank_key`` orders the candidates that fit: those within the user's limit before a raised
limit, replay-verified before modelled, comfortable before tight (headroom below
max(2 % of the limit, 20 MiB)), fewer changed settings first, then the lower price
(device calls), then the lower peak reserved. The first is the recommendation.
Headroom = limit − peak reserved (bytes; for a raised ``set_limit``, under the new limit).
When nothing fits, ``min_capacity`` is the smallest capacity (2 MiB steps) under the best
setting tried, next to the lower bound (peak live bytes, 512 B rounded) and the call-sites
holding the most live bytes at the peak.

When the device ran out (``room``, ``tracekit.advise.overhead``), the limit is the room the
process had, a setting that fits within it comes first (it needs no cure), then the
smallest set of overhead cures with which the run fits; when even every cure falls short,
the sentence says how many bytes are missing.

When the failing request was in a pool the program made itself, with a limit of its own (``pool``,
a ``PoolScope``: a CuPy ``MemoryPool`` it set a limit on), the search was of that pool alone at
that limit: the recommendation and the table say so first, every CuPy line names that pool, and
no whole-run ``advise --limit`` command is given (that option asks the default pool's question).
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NotRequired, TypedDict, cast

from tracekit.advise.candidates import Candidate, Cure, CureDict, Kind, PoolScope, PoolScopeDict
from tracekit.advise.evaluate import Outcome
from tracekit.advise.on_device import DeviceCheck, DeviceCheckDict
from tracekit.advise.overhead import Room, RoomDict
from tracekit.advise.rerun import RECORD_OPTIONS, Rerun, RerunDict
from tracekit.advise.verdict import ORDER, WORDS, Margin, Verdict
from tracekit.analysis.leaks import SiteBytes
from tracekit.inputs import safe_text, shell_word
from tracekit.units import format_size

RECORDED_PART = "verified through the failing request; the run past it was not recorded"
TIGHT_MIN = 20 << 20
WHOLE_RUN = "verified through the end of the recorded run; nothing after it was recorded"


def tight(o: Outcome) -> bool:
    """Headroom under max(2 % of the capacity, 20 MiB): a run a little past the recorded part may not fit."""
    cap = o.capacity or 0
    return (o.headroom or 0) < max(cap // 50, TIGHT_MIN)


def rank_key(o: Outcome) -> tuple[int, int, int, int, int, int]:
    return (int(o.candidate.kind == Kind.CUPY_LIMIT), int(not o.verified_by_replay), int(tight(o)),
            o.candidate.keys, o.price, o.peak_reserved)


@dataclass(frozen=True)
class RoomAdvice:
    """The device ran out: its room, the cures the budget shows, each replayed (``tried``), and
    ``pick``, the smallest set with which the run fits (None when none does)."""

    room: Room
    cures: tuple[Cure, ...]
    tried: tuple[Outcome, ...]
    pick: Outcome | None
    short: bool  # even every cure together leaves the run short
    notes: tuple[str, ...] = ()

    @property
    def missing_after_all(self) -> int | None:
        """Bytes still missing with every cure applied (None: the need is unknown)."""
        m = self.room.missing
        return None if m is None else max(0, m - sum(c.returns for c in self.cures))


class OutcomeDict(TypedDict, total=False):
    """One setting or cure in ``fits``/``tried``; ``line`` in ``fits`` only, ``error`` in ``tried`` only,
    ``cures``/``returns_bytes`` for cures only."""

    setting: str
    kind: str
    policy: str | None
    options: dict[str, str]
    capacity_bytes: int | None
    fits: bool
    peak_reserved_bytes: int
    headroom_bytes: int | None
    device_allocs: int
    device_frees: int
    price: int
    verified_by_replay: bool
    verdict: str
    gets_through: bool
    margin_bytes: int | None
    handled_served: int
    line: str
    error: str | None
    cures: list[CureDict]
    returns_bytes: int


class MarginDict(TypedDict):
    """``margin`` in ``advise --json``: the headroom a setting needs to be called a fit."""

    workload: str
    fraction: float
    floor_bytes: int
    bytes_at_limit: int
    why: str


class AdviseDict(TypedDict):
    """``tracekit advise --json``: ``devices`` holds each device's own answer (several devices only);
    ``pool`` only where the search was of the program's own pool (``PoolScope``; answers of the
    default pool keep the document they always had)."""

    trace: str | None
    kind: str
    device: int | None
    limit_bytes: int
    limit_is: str
    failing_seq: int | None
    fits: list[OutcomeDict]
    borderline: list[OutcomeDict]
    margin: MarginDict | None
    recommendation: str
    min_capacity_bytes: int | None
    min_capacity_setting: str | None
    fit_capacity_bytes: int | None
    whole_run: list[str]  # a run that died: record the whole run with room, then advise on it (or none)
    lower_bound_bytes: int
    top_sites_at_peak: list[dict[str, Any]]
    tried: list[OutcomeDict]
    room: RoomDict | None
    cures: list[CureDict]
    missing_bytes: int | None
    scope: str
    notes: list[str]
    device_checks: list[DeviceCheckDict]
    reruns: list[RerunDict]
    devices: list[AdviseDict]
    pool: NotRequired[PoolScopeDict]


@dataclass(frozen=True)
class OwnLimit:
    """A recording's limit that ``record --limit`` did not set (bytes): the program's own
    (``set_per_process_memory_fraction``, a CuPy pool's ``set_limit``), which would stop the whole run,
    recorded again with room, where the recording stopped; ``certain`` False where the trace does not
    say how it was run; ``pool``: the program's own pool the limit is of (None: the default pool)."""

    bytes: int
    certain: bool
    pool: PoolScope | None = None


def _record_whole(kind: str, trace: str | None, program: tuple[str, ...] | None,
                  own: OwnLimit | None) -> tuple[str | None, str]:
    """The command that records the whole program once with room to finish (None for a kind
    ``tracekit record`` does not record), and the trace it writes; ``program``: the recorded
    program's words (``rerun.program_words``), else a placeholder."""
    whole = f"{Path(trace).stem}-whole.parquet" if trace else "whole.parquet"
    options = RECORD_OPTIONS.get(kind)
    if options is None:
        return None, whole
    target = "YOUR_SCRIPT.py" if program is None else safe_text(shlex.join(program))
    text = f"{shlex.join(('tracekit', 'record', *options, '-o', whole))} {target}"
    if own is not None:
        whose = "the limit the program sets itself" if own.certain else "any limit the program sets itself"
        if own.pool is not None:
            whose = f"the limit the program sets on its own pool {own.pool.name()}"
        text += f", lifting {whose} ({own.bytes} bytes in the recording) wherever the command sets it"
    return text, whole


def _torch_room(c: Candidate, capacity: int) -> str:
    """What a PyTorch setting's line cannot say: the capacity it needs (its line is the setting alone)."""
    if c.kind != Kind.TORCH_CONF:
        return ""
    return (f", with {capacity} bytes for PyTorch's allocator (a device with that much free, or "
            f"torch.cuda.set_per_process_memory_fraction({capacity} / the device's total); a limit the "
            "command sets itself raised to that)")


def outcome_dict(o: Outcome) -> OutcomeDict:
    """``Outcome.to_dict`` with a cure candidate's cures and the bytes they give back."""
    d = o.to_dict()
    out = OutcomeDict(
        setting=d["setting"], kind=d["kind"], policy=d["policy"], options=d["options"],
        capacity_bytes=d["capacity_bytes"], fits=d["fits"], peak_reserved_bytes=d["peak_reserved_bytes"],
        headroom_bytes=d["headroom_bytes"], device_allocs=d["device_allocs"], device_frees=d["device_frees"],
        price=d["price"], verified_by_replay=d["verified_by_replay"], verdict=d["verdict"],
        gets_through=d["gets_through"], margin_bytes=d["margin_bytes"], handled_served=d["handled_served"])
    if o.candidate.cures:
        out["cures"] = [c.to_dict() for c in o.candidate.cures]
        out["returns_bytes"] = o.candidate.returns
    return out


@dataclass(frozen=True)
class AdviseResult:
    """Everything ``advise`` found (bytes unless noted)."""

    trace: str | None
    kind: str  # torch, cupy or raw
    limit: int
    failing_seq: int | None  # the recorded failing request, None when the run did not fail
    tried: tuple[Outcome, ...]
    fits: tuple[Outcome, ...]  # ranked, recommendation first
    min_capacity: int | None
    min_capacity_setting: Candidate | None
    lower_bound: int
    top_sites: tuple[SiteBytes, ...]
    command: str | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)
    device_checks: tuple[DeviceCheck, ...] = ()  # with --verify-on-device
    device: int | None = None
    room: RoomAdvice | None = None  # the device ran out: the limit is the room the process had
    margin: Margin | None = None  # the verdicts' margin (tracekit.advise.verdict)
    borderline: tuple[Outcome, ...] = ()  # get through with headroom within the margin, best first
    reruns: tuple[Rerun, ...] = ()  # with --rerun: the real program under the best settings
    devices: tuple[AdviseResult, ...] = ()  # a trace of several devices: each device's own answer
    fit_capacity: int | None = None  # nothing fits: where min_capacity_setting fits, margin kept
    own_limit: OwnLimit | None = None  # a limit record's --limit did not set
    program: tuple[str, ...] | None = None  # the recorded program, as record's words
    pool: PoolScope | None = None  # the program's own pool the search was of (None: the default pool)
    default_alone: bool = False  # the default pool's rows alone were replayed (``run.default_rows``)

    @property
    def scope(self) -> str:
        return RECORDED_PART if self.failing_seq is not None else WHOLE_RUN

    def line(self, cand: Candidate, capacity: int | None) -> str:
        text = cand.line(capacity, self.trace or "TRACE", self.pool)
        if cand.kind == Kind.TORCH_CONF and self.command:
            text += f" {safe_text(self.command)}"  # one line, whatever the recorded command held
        return text

    def whole_run_lines(self) -> tuple[str, ...]:
        """The commands the recommendation gives for a run that died (``_whole_run``): record the whole
        run once with room, then advise on it at the limit asked about; () where it gives none (the run
        did not die, the device itself ran out, no fit or capacity is named, or a raw trace, which no
        ``tracekit record`` makes); the record command alone for a search of the program's own pool,
        whose question ``advise --limit`` does not ask. Its branches are ``recommendation``'s (a test
        holds them equal)."""
        if self.failing_seq is None or self.room is not None:
            return ()
        fits = bool(self.fits and not self.fits[0].candidate.cures)
        if not fits and self.margin is not None and not self.margin.explains:
            return ()
        named = self.min_capacity is not None and self.min_capacity_setting is not None and not (
            self.fit_capacity is None and self.margin is not None and self.margin.explains
            and not self.margin.exact)
        record, whole = _record_whole(self.kind, self.trace, self.program, None)
        if not (fits or named) or record is None:
            return ()
        if self.pool is not None:
            return (record,)
        return record, f"tracekit advise {shell_word(whole)} --limit {self.limit}"

    def recommendation(self) -> str:
        if self.fits and not self.fits[0].candidate.cures:
            o = self.fits[0]
            where = (f"under the limit of {format_size(self.limit)}" if o.candidate.kind != Kind.CUPY_LIMIT
                     else f"with the pool limit raised to {format_size(o.capacity or 0)}")
            if self.room is not None:
                where = f"within the room the process had ({format_size(self.limit)})"
            model = "" if o.verified_by_replay else " (by the device-allocator model, not a replay)"
            # A run that died: what lies past its failing request is not known (not said where the device
            # itself ran out: the room is the device's). Said before the line, which stays last, since a
            # CuPy line may end in a comment.
            rest = self._whole_run(scoped=True) if self.room is None else ""
            scope = " through the failing request" if rest else ""
            return (f"{self._pool_said()}{o.label()} fits {where}{scope}{model}, peak reserved "
                    f"{format_size(o.peak_reserved)} with {format_size(o.headroom or 0)} headroom"
                    f"{_margin_said(o)}{self._fallbacks(o)}{rest}; "
                    f"rerun with: {self.line(o.candidate, o.capacity)}")
        if self.room is not None:
            return self._room_sentence(self.room)
        if self.margin is not None and not self.margin.explains:
            return f"{self._opening('No setting is recommended')}: {self.margin.why}."
        text = f"{self._opening('Nothing tried fits')} under {format_size(self.limit)}"
        if self.borderline:
            b = self.borderline[0]
            text += (f" with the margin; borderline: {b.label()} gets through the replay at a peak reserved "
                     f"of "
                     f"{format_size(b.peak_reserved)}, {format_size(b.headroom or 0)} headroom, within the "
                     f"{format_size(b.margin or 0)} a real run of this workload can exceed the replay by"
                     f"{self._fallbacks(b)}: try it for real before relying on it ({self._try_for_real()}"
                     f"{self.line(b.candidate, b.capacity)})")
        if self.min_capacity is not None and self.min_capacity_setting is not None:
            c = self.min_capacity_setting
            fit = self.fit_capacity
            if fit is not None and fit != self.min_capacity and self.margin:
                text += (f"; with {c.label()} the replay gets through from {format_size(self.min_capacity)}, "
                         f"and it fits with the margin ({format_size(self.margin.bytes_at(fit))} there) from "
                         f"{format_size(fit)}: {self.line(c, fit)}{_torch_room(c, fit)}")
                text += self._whole_run()
            elif fit is None and self.margin is not None and self.margin.explains and not self.margin.exact:
                # no capacity is offered as the fix: the smallest one the replay gets through has
                # no headroom over the margin, and none raised from it got the margin either
                text += (f"; with {c.label()} the replay gets through from {format_size(self.min_capacity)}, "
                         "within the margin there, and no capacity tried above it fits with the margin: "
                         "no capacity is recommended")
            else:
                text += (f"; the smallest capacity is {format_size(self.min_capacity)} with {c.label()} "
                         f"({self.line(c, self.min_capacity)}{_torch_room(c, self.min_capacity)})"
                         f"{self._whole_run()}")
        text += f"; the live bytes alone need {format_size(self.lower_bound)}"
        if self.top_sites:
            s = self.top_sites[0]
            who = s.site or "unknown call-sites"
            text += f"; shrink what {who} holds ({format_size(s.bytes)} at the peak)"
        return text + "."

    def _try_for_real(self) -> str:
        """How to run the program under a setting, before its line: ``advise --rerun`` where it can
        apply it; a setting of the program's own pool is made in the program."""
        if self.pool is not None:
            return "run the program with: "
        return f"tracekit advise {shell_word(self.trace) if self.trace else 'TRACE'} --rerun 1, or: "

    def _pool_said(self) -> str:
        """Where the search was of the program's own pool (``pool``): which pool, at which limit, and
        that it was replayed alone, said before the answer; else nothing."""
        p = self.pool
        if p is None:
            return ""
        how = ("that pool replayed alone (each CuPy pool has its own limit)" if p.alone else
               "the trace's pool column does not mark that pool's rows, so every row of the device was "
               "replayed under its limit (an upper estimate of what that pool needs)")
        return (f"The request failed in the program's own pool {p.name()}, at the limit the program set on "
                f"it ({format_size(p.limit)}); {how}: ")

    def _opening(self, words: str) -> str:
        """``words`` opening the recommendation, after what ``_pool_said`` says where it says it."""
        said = self._pool_said()
        return said + words[:1].lower() + words[1:] if said else words

    def _whole_run(self, scoped: bool = False) -> str:
        """For a fit or a capacity on a run that died: what the trace cannot say, and how to get the
        trace that can (the whole run, recorded once with room, advised at this limit); ``scoped``:
        the caller has said already that the answer holds through the failing request."""
        if self.failing_seq is None:  # the recording went to the program's end
            return ""
        record, whole = _record_whole(self.kind, self.trace, self.program, self.own_limit)
        how = f" ({record})" if record is not None else ""
        head = "" if scoped else " that is checked through the failing request only:"
        if self.pool is not None:  # ``advise --limit`` asks the default pool's question: no command for it
            return (f";{head} the trace ends there, and the program would have gone on past it, so what "
                    f"that pool needs for the whole run is not in this trace: record the whole run once with "
                    f"room to finish{how} and read that pool's peak in it")
        advise_whole = f"tracekit advise {shell_word(whole)} --limit {self.limit}"
        return (f";{head} the trace ends there, and the program would have gone on past it "
                "(docs/fidelity.md: a GPT-2 that fit 6 GiB up to its failing request needed 8.12 GiB for its "
                f"whole run), so record the whole run once with room to finish{how} and advise on that trace "
                f"at the limit asked about ({format_size(self.limit)}: {advise_whole})")

    def _fallbacks(self, o: Outcome) -> str:
        """Said when the verdict rests on the model of handled OOMs served (the original request in
        its fallback's place)."""
        if not o.handled_served:
            return ""
        return (f"; this rests on {o.handled_served} handled OOM(s) served under it, each modelled as the "
                "original request held in place of the program's fallback")

    def _room_sentence(self, ra: RoomAdvice) -> str:
        """The device ran out: the room, what the run needs, and the cure (or what is missing)."""
        r, fs = ra.room, format_size
        head = f"The device ran out, not a pool limit: {r.sentence()}"
        if r.need is None:
            return head + "; no capacity up to the device's lets the recorded setting fit."
        head += f", and the run needs {fs(r.need)} through the failing request ({fs(r.missing or 0)} more)"
        if ra.pick is not None:
            o = ra.pick
            cs = o.candidate.cures
            what = " and ".join(f"{c.target} (gives back {fs(c.returns)}, {c.how.value})" for c in cs)
            together = f", {fs(o.candidate.returns)} together" if len(cs) > 1 else ""
            steps = " ".join(f"{_cap(c.when)}: {c.action}." for c in cs)
            also = [x.candidate.cures[0] for x in ra.tried
                    if x.fits and x is not o and len(x.candidate.cures) == 1]
            tail = f" Also enough alone: {'; '.join(f'{c.target} ({fs(c.returns)})' for c in also[:2])}." \
                if also else ""
            then = ("the run then fits" if o.ok else
                    f"the run is then borderline (headroom within the {fs(o.margin or 0)} margin)")
            return (f"{head}. {'Cure' if len(cs) == 1 else 'Cures'}: {what}{together}; {then}, "
                    f"peak reserved {fs(o.peak_reserved)} with {fs(o.headroom or 0)} headroom. {steps}{tail}")
        if not ra.cures:
            return (f"{head}; no term of the device budget that this program controls grew, so "
                    f"{self._shrink()}.")
        return (f"{head}; every cure together gives back {fs(sum(c.returns for c in ra.cures))}, "
                f"{fs(ra.missing_after_all or 0)} short, so {self._shrink()}.")

    def _shrink(self) -> str:
        text = f"the live bytes alone need {format_size(self.lower_bound)}"
        if self.top_sites:
            s = self.top_sites[0]
            who = s.site or "unknown call-sites"
            text += f"; shrink what {who} holds ({format_size(s.bytes)} at the peak)"
        return text

    def to_dict(self) -> dict[str, Any]:
        """``as_json`` for callers that read it as a plain dict (the report)."""
        return cast(dict[str, Any], self.as_json())

    def as_json(self) -> AdviseDict:
        """The ``--json`` document (``AdviseDict``)."""
        fits = []
        for o in self.fits:
            d = outcome_dict(o)
            d["line"] = self.line(o.candidate, o.capacity)
            fits.append(d)
        tried = []
        for o in self.tried:
            d = outcome_dict(o)
            d["error"] = o.error
            tried.append(d)
        borderline = []
        for o in self.borderline:
            d = outcome_dict(o)
            d["line"] = self.line(o.candidate, o.capacity)
            borderline.append(d)
        ra, m = self.room, self.margin
        margin = None if m is None else MarginDict(
            workload=m.workload.value, fraction=m.fraction, floor_bytes=m.floor,
            bytes_at_limit=m.bytes_at(self.limit), why=m.why)
        doc: AdviseDict = {
            "trace": self.trace, "kind": self.kind, "device": self.device, "limit_bytes": self.limit,
            "limit_is": "room" if ra is not None else "limit",
            "failing_seq": self.failing_seq, "fits": fits, "borderline": borderline, "margin": margin,
            "recommendation": self.recommendation(),
            "min_capacity_bytes": self.min_capacity,
            "min_capacity_setting": self.min_capacity_setting.label() if self.min_capacity_setting else None,
            "fit_capacity_bytes": self.fit_capacity,
            "whole_run": list(self.whole_run_lines()),
            "lower_bound_bytes": self.lower_bound,
            "top_sites_at_peak": [s.to_dict() for s in self.top_sites],
            "tried": tried,
            "room": ra.room.to_dict() if ra is not None else None,
            "cures": [c.to_dict() for c in ra.cures] if ra is not None else [],
            "missing_bytes": (ra.missing_after_all if ra.pick is None else 0) if ra is not None else None,
            "scope": self.scope, "notes": list(self.notes),
            "device_checks": [c.to_dict() for c in self.device_checks],
            "reruns": [r.to_dict() for r in self.reruns],
            "devices": [r.as_json() for r in self.devices],
        }
        if self.pool is not None:  # only here: the default pool's answers keep the document they had
            doc["pool"] = self.pool.to_dict()
        return doc

    def to_text(self) -> str:
        """The table(s) and the recommendation; a trace of several devices gets one section each."""
        if not self.devices:
            return "\n".join(self._lines())
        out = [f"{len(self.devices)} devices, each advised on its own (devices are never added together)"]
        for r in self.devices:
            out += ["", f"== device {r.device}", *r._lines()]
        out += ["", f"recommendation (device {self.device}, the one that ran out): {self.recommendation()}"]
        return "\n".join(out)

    def _lines(self) -> list[str]:
        fs = format_size
        if self.room is not None:
            r = self.room.room
            need = f"; the run needs {fs(r.need)} through the failing request" if r.need is not None else ""
            head = [f"room {fs(self.limit)} ({self.limit} bytes) on device {r.device}: {fs(r.free)} free at "
                    f"the OOM (measured) + {fs(r.reserved)} in its pools{need}; {len(self.tried)} settings "
                    f"and cures tried; {self.scope}"]
        else:
            head = [f"limit {fs(self.limit)} ({self.limit} bytes); {len(self.tried)} settings tried; "
                    f"{self.scope}"]
        if self.pool is not None:
            rows_said = ("its rows alone were replayed (each CuPy pool has its own limit)" if self.pool.alone
                         else "every row of the device was replayed (the pool column does not mark its rows)")
            head.insert(0, f"pool {self.pool.name()}, the program's own, at the limit the program set on it: "
                           f"{rows_said}")
        if self.margin is not None:
            head.append(f"fits = headroom above the {self.margin.sentence(self.limit)}")
        rows: list[tuple[str, ...]] = [("setting", "fits", "peak reserved", "headroom", "device allocs/frees",
                                        "verified")]
        settings = (o for o in self.tried if not o.candidate.cures)
        for o in sorted(settings, key=lambda o: (ORDER[verdict_of(o)], rank_key(o))):
            rows.append((
                o.label() + (" *" if o.handled_served and o.fits else ""), WORDS[verdict_of(o)],
                fs(o.peak_reserved),
                signed(o.headroom) if o.fits and o.headroom is not None else "",
                f"{o.device_allocs}/{o.device_frees}", "replay" if o.verified_by_replay else "model",
            ))
        lines = head + _table(rows)
        if self.room is not None and self.room.tried:
            lines.append("overhead cures (the recorded setting replayed with the room each gives back):")
            cure_rows: list[tuple[str, ...]] = [("gives back", "how", "fits", "cure")]
            for o in self.room.tried:
                how = "/".join(sorted({c.how.value for c in o.candidate.cures}))
                cure_rows.append((fs(o.candidate.returns), how, WORDS[verdict_of(o)], o.label()))
            lines += ["  " + line for line in _table(cure_rows, right=(0,))]
            lines += [f"  instead: {c.alternative}" for c in self.room.cures if c.alternative]
        if not self.fits and self.top_sites:
            lines.append("held at the peak of live bytes:")
            lines += [f"  {fs(s.bytes):>12}  {s.blocks:>6} blocks  {s.site or '(no call-site)'}"
                      for s in self.top_sites]
        if any(o.handled_served and o.fits for o in self.tried):
            lines.append("* the replay served handled OOMs of the recording: the original request is held in "
                         "place of the program's fallback (its smaller retry) for the fallback's lifetime")
        lines += [f"note: {n}" for n in self.notes]
        for c in self.device_checks:
            verdict = {True: "confirmed on the device", False: "model and device DISAGREE",
                       None: f"not checked ({c.note})"}[c.agrees]
            lines.append(f"device: {c.setting}: {verdict}")
        if self.reruns:
            lines += rerun_lines(self.reruns)
        lines.append(f"recommendation: {self.recommendation()}")
        return lines


def _margin_said(o: Outcome) -> str:
    return f" (more than the {format_size(o.margin)} margin)" if o.margin else ""


def rerun_lines(reruns: Sequence[Rerun]) -> list[str]:
    """The table of ``--rerun``: each setting's prediction beside what the real program did."""
    def yn(b: bool | None) -> str:
        return "" if b is None else ("yes" if b else "no")

    rows: list[tuple[str, ...]] = [("setting", "predicted", "past the failing request", "finished",
                                    "peak reserved predicted / real", "agrees")]
    for r in reruns:
        if not r.ran:
            rows.append((r.setting, WORDS[r.predicted], r.note, "", "", ""))
            continue
        real = format_size(r.real_peak) if r.real_peak is not None else "?"
        done = yn(r.finished) + (" (timed out)" if r.timed_out else "") + f" (exit {r.exit_code})"
        rows.append((r.setting, WORDS[r.predicted], yn(r.got_past), done,
                     f"{format_size(r.predicted_peak)} / {real}",
                     "(not run under it)" if r.overridden
                     else {True: "yes", False: "NO", None: "(borderline: no claim)"}[r.agrees]))
    out = ["rerun: the recorded program run for real under each setting (tracekit record):"]
    out += ["  " + line for line in _table(rows, right=())]
    out += [f"  {r.setting}: {r.note}" for r in reruns if r.ran and r.note]
    traces = {str(Path(r.trace).parent) for r in reruns if r.trace}
    out += [f"  the reruns' traces: {t}" for t in sorted(traces)]
    return out


def verdict_of(o: Outcome) -> Verdict:
    """A judged outcome's verdict; an unjudged one (no margin known) by the replay alone."""
    if o.verdict is not None:
        return o.verdict
    return Verdict.ERROR if o.error else (Verdict.FITS if o.fits else Verdict.NO)


def signed(n: int) -> str:
    return ("-" + format_size(-n)) if n < 0 else format_size(n)


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


def _table(rows: Sequence[Sequence[str]], right: tuple[int, ...] | None = None) -> list[str]:
    """Columns padded to their widest cell; the first left-aligned, the rest right-aligned
    (``right``: the columns to right-align instead)."""
    w = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]

    def cell(i: int, c: str) -> str:
        on_right = i in right if right is not None else i > 0
        return f"{c:>{w[i]}}" if on_right else f"{c:<{w[i]}}"

    return ["  ".join(cell(i, c) for i, c in enumerate(r)).rstrip() for r in rows]
