"""The trace of a ``record --torch`` run: PyTorch's snapshot converted, call-sites made relative to
the program's folder, the launcher's frames cut, and the OOM states, exit and pools stored.

Two callers write it: the recorded process at its end (``tracekit.record.torch``), and the watcher
(``tracekit.record.watch``) after the process died without an end (``os._exit``, ``exec``, SIGKILL),
from the snapshot made of the tracker's ring (``tracekit.record.torch_ring``). It sits below both so
that neither imports the other.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from tracekit.record.final import Keep, write_final
from tracekit.trace.recorded import TORCH_POOL_LABEL


@dataclasses.dataclass(frozen=True)
class TorchEnd:
    """What the recorder knows of the run besides the snapshot, as the trace's writer needs it: the
    snapshot's path (named in messages), the device measured at each OOM, the recording's device,
    the bytes the allocator was allowed, and how to run the program again."""

    where: Path
    states: tuple[dict[str, Any], ...]
    device: int
    allowed_bytes: int | None
    rerun: dict[str, Any]


def write_torch_trace(snap: dict[str, Any], rec: TorchEnd, out: Path, exit_info: dict[str, Any],
                      launch: dict[str, Any], roots: tuple[str, ...], keep: Keep | None = None,
                      extra: dict[str, Any] | None = None) -> Path:
    """Write the trace of ``snap`` at ``out``, or beside it where the program made its own file there
    (``tracekit.record.final``); returns where it went. The recorded process calls it at its end,
    the watcher (``tracekit.record.watch``) after the process died, with the snapshot made from the
    tracker's ring (``tracekit.record.torch_ring``)."""
    from tracekit.importers.torch_snapshot import convert
    from tracekit.record.callstacks import TORCH_PACKAGES
    from tracekit.record.meta import environment_meta
    from tracekit.record.sites import relative_path, relative_site
    from tracekit.trace import Op, write_trace
    from tracekit.trace.stacks import trim_outer, with_kinds

    c = convert(snap, rec.where)
    env = environment_meta(roots, TORCH_PACKAGES)  # at the end: sys.path as the program left it
    table = with_kinds(c.events.stacks, env.folders())  # decided on the absolute paths, as CuPy's are
    relative = dataclasses.replace(table, file=tuple(relative_path(f, roots) for f in table.file))
    stacks, lut = trim_outer(relative, launcher_frames(relative))
    events = dataclasses.replace(c.events, sites=tuple(relative_site(s, roots) for s in c.events.sites),
                                 stack=lut[c.events.stack], stacks=stacks)
    oom_rows = np.flatnonzero(events.op == Op.OOM)
    states = [dict(st) for st in rec.states[-len(oom_rows):]] if len(oom_rows) else []
    rows = oom_rows[len(oom_rows) - len(states):]
    oom_states = [{"seq": int(events.seq[i]), "device": st.pop("device"), "t_ns": int(events.t_ns[i]), **st}
                  for i, st in zip(rows.tolist(), states, strict=True)]
    died = exit_info.pop("died_of_oom")
    exit_info["oom_seq"] = int(events.seq[oom_rows[-1]]) if died and len(oom_rows) else None
    if exit_info["oom_seq"] is not None:
        events = with_site(events, int(oom_rows[-1]), exit_info.get("site"))
    devices = sorted({int(d) for d in np.unique(events.device)} | {rec.device})
    pools = [{"id": i, "device": d, "kind": "pool", "label": TORCH_POOL_LABEL,
              "limit_bytes": rec.allowed_bytes} for i, d in enumerate(devices)]
    pool_of = np.zeros(max(devices) + 1, np.int64)
    pool_of[devices] = np.arange(len(devices))
    extras = {**c.extras, "pool": pa.array(pool_of[events.device], pa.uint16())}
    meta = dataclasses.replace(c.meta, environment=env).with_extra(
        oom_states=oom_states, exit=exit_info, pools=pools, launch=launch, sites_relative_to=list(roots),
        rerun=rec.rerun, **(extra or {}))
    return write_final(out, lambda path, more: write_trace(path, meta.with_extra(**more), events, extras),
                       keep)


# The frames that run the program rather than belong to it: runpy and tracekit's command line
# (typer, click, tracekit itself), as paths relative to the library folders, and the console
# script a `tracekit record` (not `python -m tracekit record`) starts from (.../bin/tracekit).
LAUNCHER = re.compile(r"^(?:<frozen runpy>|runpy\.py|typer/|click/|tracekit/)|(?:^|/)tracekit$")


def launcher_frames(table: Any) -> np.ndarray:
    """bool per frame of ``table``: a frame of the launcher, cut from the outer end of every stack
    (PyTorch's history records the whole interpreter stack, ``python -m tracekit record`` included)."""
    return np.array([bool(LAUNCHER.search(f)) for f in table.file], dtype=bool)


def with_site(events: Any, row: int, text: str | None) -> Any:
    """``events`` with event ``row`` at call-site ``text`` where it has none (PyTorch's history
    recorded no frames for it), and that frame as its one-frame stack; unchanged otherwise."""
    from tracekit.trace.stacks import MAX_LINE, StackInterner, guess_kind, parse_site

    if text is None or events.site[row] >= 0:
        return events
    sites = tuple(events.sites)
    sid = sites.index(text) if text in sites else len(sites)
    site = np.array(events.site, copy=True)
    site[row] = sid
    interner = StackInterner()
    lut = interner.add(events.stacks)  # ids kept where the table has no two equal stacks
    file, line, function = parse_site(text)
    frame = interner.frame_id(file, line if line <= MAX_LINE else -1, function, int(guess_kind(file)))
    stack = lut[events.stack]
    if events.stack[row] < 0:
        stack[row] = interner.stack_id(frame, -1)
    return dataclasses.replace(events, site=site, sites=sites if sid < len(sites) else (*sites, text),
                               stack=stack, stacks=interner.table())


def finish_from_ring(ring: Path, out: Path, extra: dict[str, Any], keep: Keep | None = None) -> Path | None:
    """The trace of a recording whose process is gone (the watcher's work): PyTorch's snapshot made
    from the tracker's ring at ``ring`` and what the recorder wrote beside it at the start
    (``tracekit.record.torch_ring``); where it went, None where the ring holds nothing usable."""
    from tracekit.record.torch_ring import read_head, read_rows, snapshot_from_ring

    read = read_rows(ring)
    if read is None:
        return None
    head = read_head(out)
    snap = snapshot_from_ring(read, head)
    device = int(head.get("device", 0) or 0)
    info = head.get("info") if isinstance(head.get("info"), dict) else {}
    allowed = info.get("allowed_bytes") if isinstance(info, dict) else None
    rerun, launch = head.get("rerun"), head.get("launch")
    end = TorchEnd(ring, (), device, int(allowed) if isinstance(allowed, int) else None,
                   rerun if isinstance(rerun, dict) else {})
    exit_info = {"status": None, "exception": None, "signal": None, "code": None, "message": None,
                 "oom_seq": None, "died_of_oom": False, "site": None}
    roots = tuple(str(r) for r in head.get("roots") or [] if isinstance(r, str))
    ring_meta = {"torch_ring": {"rows": int(len(read.rows)), "missing": read.missing, "frames": False}}
    launch = launch if isinstance(launch, dict) else {}
    return write_torch_trace(snap, end, out, exit_info, launch, roots, keep, {**ring_meta, **extra})
