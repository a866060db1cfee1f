"""PyTorch snapshot import on hand-built snapshots: every action, the rebuilt start state, formats.

Each snapshot here is a dict written with plain ``pickle`` exactly as
``_dump_snapshot`` would, so the expected rows can be worked out by hand.
"""

from __future__ import annotations

import gzip
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from tracekit.cli.app import app
from tracekit.errors import InputError
from tracekit.importers.torch_snapshot import import_snapshot
from tracekit.trace import Op, read_trace

MiB = 1 << 20
A = 0x7F00_0000_0000  # a segment base
USER = {"filename": "/home/u/train.py", "line": 12, "name": "step"}
TORCH = {"filename": "/venv/lib/python3.12/site-packages/torch/nn/modules/linear.py", "line": 125,
         "name": "forward"}


def entry(action: str, addr: int, size: int, t: int, frames: list[Any] | None = None,
          stream: int = 0, **kw: Any) -> dict[str, Any]:
    e = {"action": action, "addr": addr, "size": size, "stream": stream, "time_us": t,
         "compile_context": "N/A", "user_metadata": "", "frames": frames or [], **kw}
    if action == "oom":
        del e["addr"]
    return e


def segment(addr: int, total: int, blocks: list[dict[str, Any]], *, device: int = 0, stream: int = 0,
            expandable: bool = False) -> dict[str, Any]:
    return {"device": device, "address": addr, "total_size": total, "allocated_size": 0,
            "active_size": 0, "requested_size": 0, "stream": stream, "segment_type": "large",
            "segment_pool_id": (0, 0), "is_expandable": expandable, "frames": [], "blocks": blocks}


def block(addr: int, size: int, req: int, state: str = "active_allocated") -> dict[str, Any]:
    return {"address": addr, "size": size, "requested_size": req, "state": state, "frames": [USER]}


def write(tmp: Path, snap: Any, name: str = "s.pickle", protocol: int = 4, gz: bool = False) -> Path:
    p = tmp / name
    data = pickle.dumps(snap, protocol=protocol)
    p.write_bytes(gzip.compress(data) if gz else data)
    return p


def load(tmp: Path, snap: Any, **kw: Any) -> Any:
    r = import_snapshot(write(tmp, snap), tmp / "out.parquet", force=True, **kw)
    tr = read_trace(r.path, strict=True)
    return tr, tr.extras.to_pydict()


def ops(tr: Any) -> list[str]:
    return [Op(int(o)).label for o in tr.events.op]


def test_each_action_is_mapped(tmp_path: Path) -> None:
    frames = [TORCH, USER]  # innermost first; the site is the first frame outside torch
    hist = [
        entry("segment_alloc", A, 20 * MiB, 1000),
        entry("alloc", A, 1000, 1001, frames),  # rounds to 1024
        entry("free_requested", A, 1000, 1003),
        entry("snapshot", 0, 4096, 1004),  # known to PyTorch, no row: skipped and counted
        entry("free_completed", A, 1000, 1005),
        entry("user_defined", 0, 0, 1006),
        entry("oom", 0, 40 * MiB, 1007, device_free=123456),
        entry("segment_free", A, 20 * MiB, 1010),
    ]
    tr, ex = load(tmp_path, {"segments": [], "device_traces": [hist]})
    ev = tr.events
    assert ops(tr) == ["segment_alloc", "malloc", "free", "oom", "segment_free"]
    assert ev.t_ns.tolist() == [0, 1000, 5000, 7000, 10000]
    assert ev.size.tolist() == [20 * MiB, 1000, 1024, 40 * MiB, 20 * MiB]
    assert ev.rounded[1] == 1024 and ev.rounded[3] == 40 * MiB
    assert ev.sites[ev.site[1]] == "/home/u/train.py:12:step"
    assert ex["free_requested_ns"] == [None, None, 3000, None, None]
    assert ex["device_free"] == [None, None, None, 123456, None]
    assert ex["initial"] == [False] * 5
    assert tr.meta.extra["torch_import"]["skipped_actions"] == {"snapshot": 1, "user_defined": 1}
    assert tr.mate.tolist() == [4, 2, 1, -1, 0]


def test_site_falls_back_to_innermost_when_all_frames_are_torch(tmp_path: Path) -> None:
    hist = [entry("segment_alloc", A, 2 * MiB, 0), entry("alloc", A, 512, 1, [TORCH])]
    tr, _ = load(tmp_path, {"segments": [segment(A, 2 * MiB, [block(A, 512, 512)])], "device_traces": [hist]})
    assert tr.events.site_name(1) == f"{TORCH['filename']}:125:forward"
    assert tr.events.site_name(0) is None  # no frames


def test_roundup_power2_divisions_from_settings(tmp_path: Path) -> None:
    div = {str(1 << i): 4 for i in range(16)}
    snap = {"segments": [], "allocator_settings": {"roundup_power2_divisions": div},
            "device_traces": [[entry("segment_alloc", A, 20 * MiB, 0), entry("alloc", A, 5 * MiB + 1, 1)]]}
    tr, _ = load(tmp_path, snap)
    assert tr.events.rounded[1] == 6 * MiB  # step 4 MiB / 4 = 1 MiB
    assert tr.meta.extra["torch_allocator_settings"]["roundup_power2_divisions"] == div


def test_wrapped_history_rebuilds_the_start_state(tmp_path: Path) -> None:
    # Before the kept history: segments S (freed in it) and T (never mentioned) existed;
    # block X (freed in it) and block Y (live at the end, never mentioned) were live.
    S, T = A, A + 100 * MiB
    X, Y, Z = S, T, T + 4 * MiB
    hist = [
        entry("free_requested", X, 3000, 50),
        entry("free_completed", X, 3000, 51),
        entry("segment_free", S, 20 * MiB, 52),
        entry("alloc", Z, 1000, 53),
    ]
    segs = [segment(T, 20 * MiB, [block(Y, 4 * MiB, 4 * MiB - 100), block(Z, 1024, 1000),
                                  block(Z + 1024, 16 * MiB - 1024, 0, "inactive")])]
    tr, ex = load(tmp_path, {"segments": segs, "device_traces": [hist]})
    ev = tr.events
    assert ex["initial"] == [True, True, True, True, False, False, False]
    assert ops(tr) == ["segment_alloc", "segment_alloc", "malloc", "malloc", "free", "segment_free", "malloc"]
    assert ev.addr[:4].tolist() == [S, T, X, Y]
    assert ev.size[:4].tolist() == [20 * MiB, 20 * MiB, 3000, 4 * MiB - 100]
    assert ev.rounded[2] == 3072 and ev.rounded[3] == 4 * MiB  # Y: the block's own size
    assert ev.t_ns.tolist() == [0, 0, 0, 0, 1000, 2000, 3000]
    assert ev.size[4] == 3072  # X's free: its rounded size
    assert ex["free_requested_ns"][4] == 0
    assert ev.site_name(3) == "/home/u/train.py:12:step"
    assert tr.meta.extra["torch_import"]["initial_rows"] == 4
    assert not tr.issues


def test_full_history_has_no_initial_rows(tmp_path: Path) -> None:
    hist = [entry("segment_alloc", A, 2 * MiB, 0), entry("alloc", A, 100, 1)]
    segs = [segment(A, 2 * MiB, [block(A, 512, 100), block(A + 512, 2 * MiB - 512, 0, "inactive")])]
    _, ex = load(tmp_path, {"segments": segs, "device_traces": [hist]})
    assert not any(ex["initial"])


def test_expandable_maps_and_unmaps_pair_on_one_grid(tmp_path: Path) -> None:
    # Map 20 MiB, then 40 MiB more, then unmap the middle 20 MiB: cuts at A, A+20, A+40, A+60 MiB.
    hist = [
        entry("segment_map", A, 20 * MiB, 0),
        entry("alloc", A, 20 * MiB, 1),
        entry("segment_map", A + 20 * MiB, 40 * MiB, 2),
        entry("free_completed", A, 20 * MiB, 3),
        entry("segment_unmap", A + 20 * MiB, 20 * MiB, 4),
    ]
    segs = [segment(A, 20 * MiB, [], expandable=True), segment(A + 40 * MiB, 20 * MiB, [], expandable=True)]
    tr, ex = load(tmp_path, {"segments": segs, "device_traces": [hist]})
    ev = tr.events
    assert ops(tr) == ["segment_alloc", "malloc", "segment_alloc", "segment_alloc", "free", "segment_free"]
    assert [(int(a) - A) // MiB for a in ev.addr] == [0, 0, 20, 40, 0, 20]
    assert ev.size[[0, 2, 3, 5]].tolist() == [20 * MiB] * 4
    assert ex["expandable"] == [True, False, True, True, False, True]
    assert tr.mate[5] == 2 and not tr.issues


def test_expandable_wrapped_start_state(tmp_path: Path) -> None:
    # The kept history only unmaps [A+20, A+40); [A, A+20) stays mapped and is never mentioned.
    hist = [entry("segment_unmap", A + 20 * MiB, 20 * MiB, 7)]
    segs = [segment(A, 20 * MiB, [], expandable=True)]
    tr, ex = load(tmp_path, {"segments": segs, "device_traces": [hist]})
    assert ops(tr) == ["segment_alloc", "segment_alloc", "segment_free"]
    assert ex["initial"] == [True, True, False]
    assert [(int(a) - A) // MiB for a in tr.events.addr] == [0, 20, 20]


def test_devices_merge_by_time_and_filter(tmp_path: Path) -> None:
    d0 = [entry("segment_alloc", A, 2 * MiB, 10), entry("alloc", A, 512, 30)]
    d1 = [entry("segment_alloc", A, 2 * MiB, 20), entry("alloc", A, 512, 25)]
    snap = {"segments": [], "device_traces": [d0, d1]}
    tr, _ = load(tmp_path, snap)
    assert tr.events.device.tolist() == [0, 1, 1, 0]
    assert tr.events.t_ns.tolist() == [0, 10000, 15000, 20000]
    tr1, _ = load(tmp_path, {"segments": [], "device_traces": [list(d0), list(d1)]}, device=1)
    assert tr1.events.device.tolist() == [1, 1] and tr1.events.t_ns.tolist() == [0, 5000]
    with pytest.raises(InputError, match="no device 3"):
        load(tmp_path, {"segments": [], "device_traces": [list(d0)]}, device=3)


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
@pytest.mark.parametrize("gz", [False, True])
def test_protocols_and_gzip(tmp_path: Path, protocol: int, gz: bool) -> None:
    snap = {"segments": [], "device_traces": [[entry("segment_alloc", A, 2 * MiB, 0)]]}
    r = import_snapshot(write(tmp_path, snap, protocol=protocol, gz=gz), tmp_path / "o.parquet")
    assert r.rows == 1


def test_legacy_bare_list_of_segments(tmp_path: Path) -> None:
    # Oldest format: a list of segments; blocks carry ``history`` instead of frames/requested_size.
    old = {"address": A, "size": 1024, "state": "active_allocated",
           "history": [{"addr": A, "real_size": 1000, "frames": [USER]}]}
    seg = segment(A, 2 * MiB, [old])
    del seg["stream"]
    tr, ex = load(tmp_path, [seg])
    assert ops(tr) == ["segment_alloc", "malloc"] and ex["initial"] == [True, True]
    assert tr.events.size[1] == 1000 and tr.events.rounded[1] == 1024


def test_history_without_time_us_uses_entry_order(tmp_path: Path) -> None:
    hist = [entry("segment_alloc", A, 2 * MiB, 0), entry("alloc", A, 512, 0)]
    for e in hist:
        del e["time_us"]
    tr, _ = load(tmp_path, {"segments": [], "device_traces": [hist]})
    assert tr.events.t_ns.tolist() == [1, 2]
    assert "no time_us" in tr.meta.extra["torch_import"]["time"]


def test_tracekit_key_gives_device_and_limit(tmp_path: Path) -> None:
    tk = {"device_name": "NVIDIA H200", "total_bytes": 150 << 30, "free_bytes_at_start": 149 << 30,
          "allowed_bytes": 14 << 30, "memory_fraction": 0.1, "torch_version": "2.11.0",
          "command": "python train.py"}
    tr, _ = load(tmp_path, {"segments": [], "device_traces": [[]], "tracekit": tk})
    assert tr.meta.pool_limit_bytes == 14 << 30 and tr.meta.device.name == "NVIDIA H200"
    assert tr.meta.versions["torch"] == "2.11.0" and tr.meta.command == "python train.py"
    assert tr.meta.extra["torch_memory_fraction"] == 0.1


def test_every_row_keeps_its_interned_stack(tmp_path: Path) -> None:
    hist = [entry("segment_alloc", A, 2 * MiB, 0), entry("alloc", A, 512, 1, [TORCH, USER]),
            entry("alloc", A + 512, 512, 2, [USER])]
    tr, ex = load(tmp_path, {"segments": [], "device_traces": [hist]})
    ev = tr.events
    assert "stack" not in ex  # the stacks are the trace's own column now, not an extra one
    assert ev.stack[0] == -1
    assert [f.label() for f in ev.stacks.frames(int(ev.stack[1]))] == [
        f"{TORCH['filename']}:125:forward", "/home/u/train.py:12:step"]
    assert [f.label() for f in ev.stacks.frames(int(ev.stack[2]))] == ["/home/u/train.py:12:step"]
    assert ev.stacks.n_frames == 2  # train.py:12 once, as the outer frame of both stacks


def test_import_torch_stacks_flag_keeps_cpp_frames(tmp_path: Path) -> None:
    cpp = {"filename": "/pytorch/c10/cuda/CUDACachingAllocator.cpp", "line": 1200, "name": "malloc"}
    snap = write(tmp_path, {"segments": [], "device_traces": [[entry("alloc", A, 512, 1, [cpp, USER])]]})
    for flags, files in (([], ["/home/u/train.py"]), (["--stacks"], [cpp["filename"], "/home/u/train.py"])):
        out = tmp_path / f"o{len(flags)}.parquet"
        r = CliRunner().invoke(app, ["import", "torch", str(snap), "-o", str(out), *flags])
        assert r.exit_code == 0, r.output
        ev = read_trace(out).events
        assert [f.file for f in ev.stacks.frames(int(ev.stack[0]))] == files


def test_not_a_snapshot(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="not a PyTorch memory snapshot"):
        load(tmp_path, {"hello": 1})
    with pytest.raises(InputError, match="holds a int"):
        load(tmp_path, 42)
    with pytest.raises(InputError, match="malformed"):
        load(tmp_path, {"segments": [], "device_traces": [[{"action": "alloc", "addr": "x"}]]})


def test_round_trip_columns_are_numpy(tmp_path: Path) -> None:
    hist = [entry("segment_alloc", A, 2 * MiB, 0)] + [entry("alloc", A + 512 * i, 512, i) for i in range(100)]
    tr, _ = load(tmp_path, {"segments": [], "device_traces": [hist]})
    assert isinstance(tr.events.addr, np.ndarray) and len(tr.events) == 101


@st.composite
def histories(draw: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A random but consistent history over 3 segments of 8 slots, and the final state it leaves."""
    live: dict[int, int] = {}  # block addr -> request
    segs: set[int] = set()
    hist: list[dict[str, Any]] = []
    for t in range(draw(st.integers(0, 60))):
        seg = A + draw(st.integers(0, 2)) * 8 * 4096
        slot = seg + draw(st.integers(0, 7)) * 4096
        if seg not in segs:
            segs.add(seg)
            hist.append(entry("segment_alloc", seg, 8 * 4096, t))
        elif slot in live:
            hist.append(entry("free_requested", slot, live[slot], t))
            hist.append(entry("free_completed", slot, live.pop(slot), t))
        elif not any(seg <= a < seg + 8 * 4096 for a in live) and draw(st.booleans()):
            segs.discard(seg)
            hist.append(entry("segment_free", seg, 8 * 4096, t))
        else:
            live[slot] = draw(st.integers(1, 4096))
            hist.append(entry("alloc", slot, live[slot], t))
    span = 8 * 4096
    final = [segment(s, span, [block(a, 4096, r) for a, r in sorted(live.items()) if s <= a < s + span])
             for s in sorted(segs)]
    return hist, final


@settings(max_examples=60, deadline=None)
@given(histories(), st.floats(0, 1))
def test_any_cut_rebuilds_the_state_at_the_cut(h: Any, frac: float) -> None:
    from tracekit.importers.torch_snapshot import convert

    hist, final = h
    k = int(len(hist) * frac)
    blocks: dict[int, int] = {}
    segs: dict[int, int] = {}
    for e in hist[:k]:  # the oracle: the state after the first k entries
        if e["action"] == "alloc":
            blocks[e["addr"]] = e["size"]
        elif e["action"] == "free_completed":
            del blocks[e["addr"]]
        elif e["action"] == "segment_alloc":
            segs[e["addr"]] = e["size"]
        elif e["action"] == "segment_free":
            del segs[e["addr"]]
    c = convert({"segments": final, "device_traces": [hist[k:]]}, Path("mem.pickle"))
    ev, extras = c.events, c.extras
    n = int(extras["initial"].to_numpy(zero_copy_only=False).sum())
    rows = list(zip(ev.op[:n].tolist(), ev.addr[:n].tolist(), ev.size[:n].tolist(), strict=True))
    assert {a: s for o, a, s in rows if o == Op.MALLOC} == blocks
    assert {a: s for o, a, s in rows if o == Op.SEGMENT_ALLOC} == segs
    from tracekit.trace.validate import pair_events

    assert not pair_events(ev.op, ev.addr, ev.device, ev.seq).issues


def test_cli_progress_and_notes(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from tracekit.cli.app import app

    hist = [entry("free_completed", A, 100, 0), entry("snapshot", 0, 0, 1)]
    p = write(tmp_path, {"segments": [], "device_traces": [hist]})
    r = CliRunner().invoke(app, ["import", "torch", str(p), "--progress"])
    assert r.exit_code == 0, r.output
    assert "unpickling: 100%" in r.output and "converting: 100%" in r.output
    assert "skipped history entries: 1 x snapshot" in r.output and "starts mid-run; 1 rows" in r.output
    assert f"Wrote {tmp_path / 's.parquet'}" in r.output


def test_pytorch_1_13_free_action(tmp_path: Path) -> None:
    hist = [entry("segment_alloc", A, 2 * MiB, 0), entry("alloc", A, 700, 1), entry("free", A, 700, 2)]
    tr, _ = load(tmp_path, {"segments": [], "device_traces": [hist]})
    assert ops(tr) == ["segment_alloc", "malloc", "free"] and tr.events.size[2] == 1024


def test_native_frames_are_never_the_site(tmp_path: Path) -> None:
    cpp = {"filename": "/pytorch/c10/cuda/CUDACachingAllocator.cpp", "line": 1500, "name": "malloc"}
    so = {"filename": "/venv/lib/python3.12/site-packages/torch/lib/libtorch_cuda.so", "line": 0,
          "name": "at::empty"}
    cell = {"filename": "<ipython-input-3>", "line": 2, "name": "<module>"}
    hist = [entry("segment_alloc", A, 2 * MiB, 0), entry("alloc", A, 512, 1, [cpp, so, TORCH, cell, USER])]
    tr, _ = load(tmp_path, {"segments": [], "device_traces": [hist]})
    assert tr.events.site_name(1) == "<ipython-input-3>:2:<module>"
