"""The browser report's data model, checked as data: columns, levels of detail, state replay, escaping.

The hand trace (``page_trace``): one 64 MiB segment at ``BASE`` filled by eight 8 MiB
blocks (event indices 1..8, call-site i % 3), the even ones freed (events 9..12), then a
16 MiB request fails (event 13). Right after event 12 the live blocks are the mallocs at
events 2, 4, 6, 8 (offsets 8, 24, 40, 56 MiB) and the largest free block is 8 MiB.
The state the page would show is rebuilt here from the model's columns alone (``replay``:
keyframe, then the window's events) and compared with the analyzer's ``pool_state_at``.

The stacks trace (``stacks_trace``) has the same shape with whole call stacks and blocks of
different sizes: frames main (train.py:100), step (train.py:88), _call_impl (torch, installed),
forward (model.py:30), conv (torch, installed), c10::cuda::malloc (C++), deepcopy (Python's
copy.py); stacks s0 = main, s1 = s0 > step, s2 = s1 > _call_impl, s3 = s2 > forward,
s4 = s3 > conv, s5 = s4 > malloc, s6 = s1 > deepcopy. Eight blocks fill the 64 MiB segment, rounded
8, 4, 8, 12, 8, 8, 4, 12 MiB at stacks s5, s4, s6, s5, s3, s1, s5, s6; blocks 0, 2, 4, 6 are freed;
then a 16 MiB request at s5 fails (fatal). ``FLAME_AT_OOM`` and ``FLAME_AT_PEAK`` are the worked
flame graphs (MiB held by each path, root first) at the OOM and at the peak (after event 8).
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tracekit.analysis import analyze_trace
from tracekit.analysis.leaks import by_label, pool_state_at
from tracekit.inputs import safe_text
from tracekit.report.page import lod, state, write_page
from tracekit.report.page.callsites import stacks_of
from tracekit.report.page.columns import column, decode
from tracekit.report.page.data import build_model
from tracekit.report.page.html import csp, model_json, page
from tracekit.report.page.text import safe_strings
from tracekit.trace import DeviceInfo, Events, Op, Source, TraceMeta, read_trace, write_trace
from tracekit.trace.callsite import CallSites
from tracekit.trace.stacks import FrameKind, StackTable, UserCode

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cli"))  # shared hand-built traces
from test_report import SITES, hand_trace

MiB = 1 << 20
HOSTILE = (
    "evil/<script>alert(1)</script>.py:1:f",
    "x.py:2:</style><b id=pwn>bold</b>",
    'y.py:3:"><img src=x onerror=alert(1)>',
)


FRAMES = (  # file, line, function, kind
    ("train.py", 100, "main", FrameKind.USER),
    ("train.py", 88, "step", FrameKind.USER),
    ("/venv/lib/python3.12/site-packages/torch/nn/modules/module.py", 1500, "_call_impl", FrameKind.LIBRARY),
    ("model.py", 30, "forward", FrameKind.USER),
    ("/venv/lib/python3.12/site-packages/torch/functional.py", 77, "conv", FrameKind.LIBRARY),
    ("c10/cuda/CUDACachingAllocator.cpp", 12, "c10::cuda::malloc", FrameKind.NATIVE),
    ("/usr/lib/python3.12/copy.py", 10, "deepcopy", FrameKind.STDLIB),
)
# The stacks trace over CuPy's stand-in and a CuPy source checkout, neither under site-packages: the
# recorder calls such frames "user", but an array library's frames are never the user's code.
FAKECUPY = Path(__file__).resolve().parents[1] / "fakecupy"
CUPY_FRAMES = (
    *FRAMES[:2],
    (str(FAKECUPY / "cupy" / "linalg.py"), 40, "solve", FrameKind.USER),
    FRAMES[3],
    ("/src/cupy/cupy/cuda/memory.py", 700, "malloc", FrameKind.USER),
    *FRAMES[5:],
)
PARENT = (-1, 0, 1, 2, 3, 4, 1)  # stack s = frame s called from stack PARENT[s]
SIZES_MIB = (8, 4, 8, 12, 8, 8, 4, 12)
BLOCK_STACK = (5, 4, 6, 5, 3, 1, 5, 6)
BASE = 1 << 32
ALL, MAIN, STEP, CALL, FWD, CONV, C10, COPY = ("all", "main", "step", "_call_impl", "forward", "conv",
                                                "c10::cuda::malloc", "deepcopy")
# Worked by hand from the docstring: live at the OOM are blocks 1 (4 MiB, s4), 3 (12, s5), 5 (8, s1)
# and 7 (12, s6).
FLAME_AT_OOM = {
    (ALL,): 36, (ALL, MAIN): 36, (ALL, MAIN, STEP): 36, (ALL, MAIN, STEP, CALL): 16,
    (ALL, MAIN, STEP, CALL, FWD): 16, (ALL, MAIN, STEP, CALL, FWD, CONV): 16,
    (ALL, MAIN, STEP, CALL, FWD, CONV, C10): 12, (ALL, MAIN, STEP, COPY): 12,
}
# At the peak every block is live: s1 holds 8 directly, deepcopy 8 + 12, forward 8 + conv (4 + 8 + 12 + 4).
FLAME_AT_PEAK = {
    (ALL,): 64, (ALL, MAIN): 64, (ALL, MAIN, STEP): 64, (ALL, MAIN, STEP, CALL): 36,
    (ALL, MAIN, STEP, CALL, FWD): 36, (ALL, MAIN, STEP, CALL, FWD, CONV): 28,
    (ALL, MAIN, STEP, CALL, FWD, CONV, C10): 24, (ALL, MAIN, STEP, COPY): 20,
}


def stacks_trace(path: Path, frames: tuple[tuple[str, int, str, FrameKind], ...] = FRAMES) -> Path:
    """The stacks trace of the module docstring (14 events), written as trace format v3."""
    table = StackTable.build([f[0] for f in frames], [f[1] for f in frames], [f[2] for f in frames],
                             [int(f[3]) for f in frames], range(len(frames)), PARENT)
    off = np.concatenate(([0], np.cumsum(SIZES_MIB)[:-1]))
    rows = [(Op.SEGMENT_ALLOC, BASE, 64 * MiB, 0, -1)]
    rows += [(Op.MALLOC, BASE + int(off[i]) * MiB, SIZES_MIB[i] * MiB - 100, SIZES_MIB[i] * MiB,
              BLOCK_STACK[i]) for i in range(8)]
    rows += [(Op.FREE, BASE + int(off[i]) * MiB, SIZES_MIB[i] * MiB - 100, 0, -1) for i in (0, 2, 4, 6)]
    rows += [(Op.OOM, 0, 16 * MiB, 16 * MiB, 5)]
    op, addr, size, rounded, stack = (np.array(c) for c in zip(*rows, strict=True))
    ev = Events.build(op=op, size=size, addr=addr, rounded=rounded, stack=stack, stacks=table,
                      t_ns=np.arange(len(op), dtype=np.int64) * 250_000_000)
    meta = TraceMeta.new(Source.SYNTHETIC, device=DeviceInfo("Test GPU", 80 * MiB, 70 * MiB))
    write_trace(path, meta, ev)
    return path


def flame_of(model: dict[str, Any], k: int) -> dict[tuple[str, ...], int]:
    """MiB held by each path (root "all", then function names outermost first) right after event k:
    every live block's rounded bytes added to each prefix of its stack's path, the stack walked
    through the model's STACK table (independent of the page's roll-up through ``parent``)."""
    blocks = model["state"]["blocks"]
    malloc, rounded, stack = decode(blocks["malloc"]), decode(blocks["rounded"]), decode(blocks["stack"])
    live, _ = replay(model, k)
    out: dict[tuple[str, ...], int] = {}
    for b in np.flatnonzero(np.isin(malloc, live)):
        names, s = [], int(stack[b])
        while s >= 0:
            names.append(model["frames"]["function"][model["stacks"]["frame"][s]])
            s = model["stacks"]["parent"][s]
        path = ("all", *reversed(names))
        for i in range(1, len(path) + 1):
            out[path[:i]] = out.get(path[:i], 0) + int(rounded[b])
    return {p: v // MiB for p, v in out.items()}


def page_trace(path: Path, sites: tuple[str, ...] = SITES, *, oom: bool = True) -> Path:
    """The trace of the module docstring (``test_report.hand_trace``), call-sites replaced by ``sites``."""
    hand_trace(path, oom=oom)
    if sites != SITES:
        t = read_trace(path)
        ev = t.events
        write_trace(path, t.meta, dataclasses.replace(ev, sites=sites, stack=ev.site,
                                                      stacks=StackTable.from_sites(sites)))
    return path


def read_model(html_path: Path) -> dict[str, Any]:
    """The JSON model embedded in a written page."""
    text = html_path.read_text(encoding="utf-8")
    m = re.search(r'<script type="application/json" id="model">(.*?)</script>', text, re.S)
    assert m is not None
    return dict(json.loads(m.group(1)))


def links(model: dict[str, Any]) -> dict[str, list[int]]:
    """The STACK table's links alone (frame, parent)."""
    return {k: model["stacks"][k] for k in ("frame", "parent")}


def site_names(model: dict[str, Any]) -> list[str | None]:
    """Each stack's call-site label as the model carries it (None: nothing to name)."""
    st = model["stacks"]
    return [st["labels"][k] if k >= 0 else None for k in st["label"]]


def ooms(model: dict[str, Any]) -> list[dict[str, Any]]:
    """The model's OOM columns as one dict per OOM (numbers as Python ints; ``diagnosis`` by name)."""
    o = model["ooms"]
    cols = {k: decode(v).tolist() for k, v in o.items() if isinstance(v, dict)}
    rows = [{k: int(v[i]) for k, v in cols.items()} | {"id": i} for i in range(o["count"])]
    for r in rows:
        r["diagnosis"] = o["diagnoses"][r["diagnosis"]]
    return rows


def replay(model: dict[str, Any], k: int) -> tuple[np.ndarray, np.ndarray]:
    """(malloc event index of each live block, segment alloc index of each live segment) right after event k,
    from the model's columns: the keyframe of k's window, then the window's events up to k."""
    st = model["state"]
    w = next(i for i, w in enumerate(st["windows"]) if w["start"] <= k < w["end"])
    win, kf = st["windows"][w], st["keyframes"]
    b_at, s_at = decode(kf["block_at"]), decode(kf["segment_at"])
    live_b = set(decode(kf["blocks"])[b_at[w]:b_at[w + 1]].tolist())
    live_s = set(decode(kf["segments"])[s_at[w]:s_at[w + 1]].tolist())
    ev = st["events"]
    idx, op, ref = decode(ev["index"]), decode(ev["op"]), decode(ev["ref"])
    for p in range(int(np.searchsorted(idx, win["start"])), int(np.searchsorted(idx, k, side="right"))):
        r = int(ref[p])
        if r < 0:
            continue
        {Op.MALLOC: live_b.add, Op.FREE: live_b.discard, Op.SEGMENT_ALLOC: live_s.add,
         Op.SEGMENT_FREE: live_s.discard}.get(Op(int(op[p])), lambda _: None)(r)
    malloc = decode(st["blocks"]["malloc"])
    alloc = decode(st["segments"]["alloc"])
    return np.sort(malloc[sorted(live_b)]), np.sort(alloc[sorted(live_s)])


def test_columns_round_trip_with_delta() -> None:
    x = np.array([5, 6, 7, 9, 1_000_000], np.int64)
    c = column(x, "i32", delta=True)
    assert c["delta"] and c["n"] == 5
    assert decode(c).tolist() == x.tolist()
    f = np.array([0.5, np.nan, 3.0])
    assert np.array_equal(decode(column(f, "f64")), f, equal_nan=True)
    with pytest.raises(ValueError):
        column(np.array([1 << 40]), "i32")


def test_levels_keep_min_and_max_of_every_bucket() -> None:
    """A spike inside a bucket survives every coarser level: max of maxes, min of mins."""
    import pyarrow as pa

    n = 300_000
    live = np.full(n, 10.0)
    live[123_457] = 999.0  # one spike
    live[250_001] = -5.0  # one dip
    t = pa.table({"seq": np.arange(n, dtype=np.uint64), "t_ns": np.arange(n, dtype=np.int64),
                  "live_bytes": live, "reserved_bytes": live + 1})
    tl = lod.timeline(t, True, None)
    assert [lv["bucket"] for lv in tl["levels"]] == [256, 64, 16]  # coarsest first; 300,000 / 16 <= 65,536
    for lv in tl["levels"]:
        hi, lo = decode(lv["hi"]["live"]), decode(lv["lo"]["live"])
        assert len(hi) == lv["count"] == -(-n // lv["bucket"])
        assert hi[123_457 // lv["bucket"]] == 999.0 and hi.max() == 999.0
        assert lo[250_001 // lv["bucket"]] == -5.0 and lo.min() == -5.0
    assert lod.bucket_sizes(65_536) == [1, 4, 16, 64]  # drawn event by event at the finest level


def test_hand_trace_model(tmp_path: Path) -> None:
    out = write_page(page_trace(tmp_path / "t.parquet"), tmp_path / "t.html")
    m = read_model(out)
    assert m["state"]["complete"] and m["timeline"]["n"] == 14
    (o,) = ooms(m)
    assert (o["index"], o["rounded"], o["handled"], o["largest_free_block"]) == (13, 16 * MiB, False, 8 * MiB)
    assert o["diagnosis"] == "fragmentation"
    assert m["frames"]["file"][o["stack"]] == "model/c.py" and m["frames"]["line"][o["stack"]] == 30
    assert links(m) == {"frame": [0, 1, 2], "parent": [-1, -1, -1]}
    assert site_names(m) == list(SITES)  # a one-frame stack keeps its call-site's wording
    blocks, segs = replay(m, 12)
    assert blocks.tolist() == [2, 4, 6, 8] and segs.tolist() == [0]
    b = m["state"]["blocks"]
    assert decode(b["segment"]).tolist() == [0] * 8
    assert decode(b["free"]).tolist() == [9, -1, 10, -1, 11, -1, 12, -1]
    assert decode(b["stack"]).tolist() == [0, 1, 2, 0, 1, 2, 0, 1]
    assert decode(b["malloc_t"]).tolist() == [250_000_000 * i for i in range(1, 9)]
    # The finest level is the analyzer's per-event timeline itself.
    fine = m["timeline"]["levels"][-1]
    assert fine["bucket"] == 1 and decode(fine["hi"]["largest_free"])[12] == 8 * MiB
    assert decode(fine["hi"]["live"])[8] == 64 * MiB


@pytest.mark.parametrize("name", ["torch-handled-oom", "cupy-seed"])
def test_replay_matches_the_analyzer_on_real_traces(name: str, tmp_path: Path) -> None:
    path = Path(__file__).resolve().parents[2] / "traces" / f"{name}.parquet"
    trace = read_trace(path)
    m = build_model(trace, analyze_trace(trace), name)
    m = json.loads(model_json(m))
    n = len(trace.events)
    for k in sorted({0, n // 3, n // 2, n - 1, *(o["index"] for o in ooms(m) if o["index"] >= 0)}):
        blocks, segs = replay(m, k)
        ref = pool_state_at(trace.events, trace.mate, k + 1)
        assert blocks.tolist() == sorted(ref.block_index.tolist()), k
        assert np.sort(trace.events.addr[segs]).tolist() == np.sort(ref.seg_addr).tolist(), k
    assert sum(not o["handled"] for o in ooms(m)) <= 1
    assert [o["seq"] for o in ooms(m)] == [o.seq for o in analyze_trace(trace).summary.ooms]


def test_windows_past_the_cap_rebuild_the_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the cap lowered, a synthetic trace is kept in windows; inside each the replay from its
    keyframe gives exactly the analyzer's live blocks."""
    from tracekit.synth import Pattern, synthesize

    path = tmp_path / "s.parquet"
    synthesize(Pattern("fragmenting"), 30_000, 0, path)
    monkeypatch.setattr(state, "MAX_EVENTS", 5_000)
    monkeypatch.setattr(state, "WINDOW_BUDGET", 4_000)
    monkeypatch.setattr(state, "EVEN", 8)
    trace = read_trace(path)
    m = json.loads(model_json(build_model(trace, analyze_trace(trace), "s")))
    st = m["state"]
    assert not st["complete"] and st["kept"] < 30_000 and "windows" in st["note"]
    assert any(w["start"] > 0 for w in st["windows"])
    for w in st["windows"]:
        for k in (w["start"], (w["start"] + w["end"]) // 2, w["end"] - 1):
            blocks, _ = replay(m, k)
            ref = pool_state_at(trace.events, trace.mate, k + 1)
            assert blocks.tolist() == sorted(ref.block_index.tolist()), (w, k)
    peak = m["peak"]["live_index"]
    assert any(w["start"] <= peak < w["end"] for w in st["windows"])


def test_segment_of_handles_a_segment_taken_again_at_the_same_address() -> None:
    # segment 0: [100, 200) events 0..5; segment 1: same address, events 6..; segment 2: [300, 310)
    s_addr = np.array([100, 100, 300], np.uint64)
    s_size = np.array([100, 100, 10], np.uint64)
    s_at, s_end = np.array([0, 6, 1]), np.array([5, -1, -1])
    b_addr = np.array([150, 150, 305, 250], np.uint64)
    b_at = np.array([2, 7, 3, 4])
    assert state.segment_of(b_addr, b_at, s_addr, s_size, s_at, s_end, 20).tolist() == [0, 1, 2, -1]


def test_one_frame_sites_are_one_frame_stacks(tmp_path: Path) -> None:
    """A format-2 trace: frame i is site i parsed, stack i is frame i alone, kinds and user flags follow
    the path; the blocks and the OOM name the site ids as stack ids."""
    sites = ("model/a.py:10:weights", "/x/site-packages/tv/resnet.py:151:forward", "<unknown>")
    m = read_model(write_page(page_trace(tmp_path / "t.parquet", sites), tmp_path / "t.html"))
    assert m["frames"]["file"] == ["model/a.py", "/x/site-packages/tv/resnet.py", "<unknown>"]
    assert m["frames"]["line"] == [10, 151, -1] and m["frames"]["function"] == ["weights", "forward", ""]
    assert m["frames"]["kind"] == [FrameKind.USER, FrameKind.LIBRARY, FrameKind.USER]
    assert m["frames"]["user"] == [True, False, True] and m["frames"]["kinds"][FrameKind.NATIVE] == "native"
    assert links(m) == {"frame": [0, 1, 2], "parent": [-1, -1, -1]} and m["user_code"] == []
    assert site_names(m) == list(sites)
    assert decode(m["state"]["blocks"]["stack"]).tolist() == [0, 1, 2, 0, 1, 2, 0, 1]
    assert [o["stack"] for o in ooms(m)] == [2]


def test_whole_stacks_reach_the_model(tmp_path: Path) -> None:
    """The stacks trace: the FRAME and STACK tables are the trace's own, the blocks and the OOM name
    stack ids, and the bytes rolled up along each path are the worked flame graphs."""
    path = stacks_trace(tmp_path / "s.parquet")
    m = read_model(write_page(path, tmp_path / "s.html"))
    table, stack = stacks_of(read_trace(path).events)
    assert table.n_stacks == 7 and stack.tolist()[1:9] == list(BLOCK_STACK)
    F = m["frames"]
    assert F["function"] == [f[2] for f in FRAMES] and F["line"] == [f[1] for f in FRAMES]
    assert F["kind"] == [int(f[3]) for f in FRAMES]
    assert F["user"] == [True, True, False, True, False, False, False]
    assert links(m) == {"frame": list(range(7)), "parent": list(PARENT)}
    # U: the innermost user frame; R: the innermost frame neither torch's nor C++ (deepcopy: Python's own).
    assert m["stacks"]["user_frame"] == [0, 1, 1, 3, 3, 3, 1]
    assert m["stacks"]["request_frame"] == [0, 1, 1, 3, 3, 3, 6]
    assert site_names(m) == ["train.py:100:main", "train.py:88:step", "train.py:88:step",
                             "model.py:30:forward", "model.py:30:forward", "model.py:30:forward",
                             "train.py:88 in step → /usr/lib/python3.12/copy.py:10"]
    assert decode(m["state"]["blocks"]["stack"]).tolist() == list(BLOCK_STACK)
    (o,) = ooms(m)
    assert (o["stack"], o["index"], o["handled"]) == (5, 13, False)
    assert flame_of(m, 13) == FLAME_AT_OOM
    assert flame_of(m, m["peak"]["live_index"]) == FLAME_AT_PEAK and m["peak"]["live_index"] == 8
    assert flame_of(m, 13) == flame_of(m, m["timeline"]["n"] - 1)  # never freed: live at the end


def test_user_code_paths_decide_whose_frames(tmp_path: Path) -> None:
    """``--user-code PATH``: exactly the frames under PATH are the user's, whatever their kind."""
    path = stacks_trace(tmp_path / "s.parquet")
    trace = read_trace(path)
    uc = UserCode.of(["/venv/lib/python3.12/site-packages/torch"])
    m = build_model(trace, analyze_trace(trace), "s", user_code=uc)
    assert m["frames"]["user"] == [False, False, True, False, True, False, False]
    assert m["user_code"] == list(uc.prefixes)


FATAL_SITE = "scripts/torch_workload_resnet.py:43 in main → torchvision/models/resnet.py:147"


def test_call_sites_are_the_analyzers_labels(traces_dir: Path, tmp_path: Path) -> None:
    """torch-handled-oom (whole stacks): every OOM, the peak table and the never-freed table name the
    call-sites exactly as ``tracekit analyze`` does; one label, one colour, one legend entry."""
    trace = read_trace(traces_dir / "torch-handled-oom.parquet")
    analysis = analyze_trace(trace)
    m = json.loads(model_json(build_model(trace, analysis, "t")))
    names = site_names(m)
    assert [names[o["stack"]] for o in ooms(m)] == [o.site for o in analysis.summary.ooms]
    fatal = next(o for o in ooms(m) if not o["handled"])
    assert names[fatal["stack"]] == analysis.summary.oom.site == FATAL_SITE
    rank = m["label_rank"]
    assert len(set(rank)) == len(rank) and len(set(m["stacks"]["labels"])) == len(m["stacks"]["labels"])
    assert all(" → torch/" not in x and "_conv_forward" not in x for x in m["stacks"]["labels"])
    peak, leaks = (t for t in m["tables"] if t["title"].startswith(("Call-sites at peak", "Blocks never")))
    assert [r[0] for r in leaks["rows"]] == [x.site or "(no call-site)" for x in analysis.summary.leaks]
    ev = trace.events
    st = pool_state_at(ev, trace.mate, m["peak"]["live_index"] + 1)
    cs = CallSites.of(ev.stacks)
    ref = by_label(ev.stack[st.block_index], st.block_size, cs)
    assert [r[0] for r in peak["rows"]] == [x.site or "(no call-site)" for x in ref]
    named = [r[0] for r in peak["rows"] if r[0] != "(no call-site)"]
    assert set(named) <= set(m["stacks"]["labels"]) and " → " in named[0]  # the user's line, the request's


def test_array_library_frames_outside_site_packages_are_not_the_users(tmp_path: Path) -> None:
    """CuPy's stand-in (``tests/fakecupy``) and a CuPy source checkout: recorded as kind user, read as
    the array library's (its package name), so not the user's code, unless ``--user-code`` names them."""
    trace = read_trace(stacks_trace(tmp_path / "c.parquet", CUPY_FRAMES))
    m = build_model(trace, analyze_trace(trace), "c")
    assert m["frames"]["kind"][2] == m["frames"]["kind"][4] == FrameKind.LIBRARY
    assert m["frames"]["user"] == [True, True, False, True, False, False, False]
    uc = UserCode.of([str(FAKECUPY)])
    m = build_model(trace, analyze_trace(trace, user_code=uc), "c", user_code=uc)
    assert m["frames"]["user"] == [False, False, True, False, False, False, False]


def test_hostile_call_sites_stay_data(tmp_path: Path) -> None:
    """No string from the trace can end the JSON element or add markup; the CSP names only hashes."""
    out = write_page(page_trace(tmp_path / "h.parquet", HOSTILE), tmp_path / "h.html")
    text = out.read_text(encoding="utf-8")
    body = text.split('id="model">', 1)[1].split("</script>", 1)[0]
    assert "<" not in body  # every < is \u003c inside the JSON
    assert "<img" not in text and "<b id=pwn>" not in text and text.count("<script") == 4
    m = read_model(out)
    assert m["frames"]["file"][0] == "evil/<script>alert(1)</script>.py"
    assert m["frames"]["function"][2] == '"><img src=x onerror=alert(1)>'
    policy = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', text)
    assert policy is not None
    assert policy.group(1).startswith("default-src 'none'; script-src 'sha256-")
    assert "unsafe" not in policy.group(1) and "http" not in policy.group(1)


BIDI = "evil\u202eyp.niam"  # U+202E RIGHT-TO-LEFT OVERRIDE: shown raw, the rest reads reversed
BIDI_FRAMES = (
    FRAMES[0],
    ("train.py", 88, BIDI, FrameKind.USER),
    *FRAMES[2:3],
    ("mod\u2066el.py", 30, "forward", FrameKind.USER),  # U+2066 LEFT-TO-RIGHT ISOLATE in a file name
    *FRAMES[4:],
)


def test_bidi_and_format_characters_are_escaped_in_the_model(tmp_path: Path) -> None:
    """Frame names, labels and every other text from the trace reach the page escaped as ``safe_text``
    escapes them (``\\u202e`` as six characters); no format character is left anywhere in the page."""
    out = write_page(stacks_trace(tmp_path / "b.parquet", BIDI_FRAMES), tmp_path / "b.html")
    text = out.read_text(encoding="utf-8")
    m = read_model(out)
    assert m["frames"]["function"][1] == "evil\\u202eyp.niam" == safe_text(BIDI)
    assert m["frames"]["file"][3] == "mod\\u2066el.py"
    assert "train.py:88:evil\\u202eyp.niam" in m["stacks"]["labels"]
    assert "mod\\u2066el.py:30:forward" in m["stacks"]["labels"]
    dumped = json.dumps(m, ensure_ascii=False)
    assert "\u202e" not in dumped and "\u2066" not in dumped and "\u202e" not in text
    assert safe_strings(m) == m  # escaped once: escaping again changes nothing


def test_csp_hashes_are_of_the_inlined_blocks() -> None:
    import base64
    import hashlib

    h = "'sha256-" + base64.b64encode(hashlib.sha256(b"x()").digest()).decode() + "'"
    assert csp(["x()"], []).split("script-src ")[1].startswith(h)


def test_page_is_one_file_without_network_references(tmp_path: Path) -> None:
    out = write_page(page_trace(tmp_path / "t.parquet"), tmp_path / "t.html")
    text = out.read_text(encoding="utf-8")
    assert not re.search(r'(src|href)="(https?:)?//', text)
    assert "uPlot" in text and text == page(read_model(out))  # type: ignore[arg-type]


def test_several_devices_draw_the_reported_one(tmp_path: Path) -> None:
    """Two devices, each the hand trace's pattern; the page draws the reported OOM's device, lists both
    OOMs (the other device's with index -1) and replays that device's events alone."""
    from tracekit.trace import DeviceInfo, Events, Source, TraceMeta
    from tracekit.trace.devices import select_device

    base = read_trace(page_trace(tmp_path / "one.parquet"))
    ev = base.events
    both = Events.build(
        op=np.concatenate([ev.op, ev.op]), size=np.concatenate([ev.size, ev.size]),
        addr=np.concatenate([ev.addr, ev.addr + np.uint64(1 << 40)]),
        rounded=np.concatenate([ev.rounded, ev.rounded]), site=np.concatenate([ev.site, ev.site]),
        device=np.repeat(np.array([0, 1]), len(ev)), sites=ev.sites)
    path = tmp_path / "two.parquet"
    meta = TraceMeta.new(Source.SYNTHETIC, device=DeviceInfo("Test GPU", 80 * MiB, 70 * MiB))
    write_trace(path, meta, both)
    trace = read_trace(path)
    analysis = analyze_trace(trace)
    m = json.loads(model_json(build_model(trace, analysis, "two")))
    drawn = m["trace"]["device"]
    assert m["trace"]["devices"] == [0, 1] and drawn == analysis.summary.device and m["timeline"]["n"] == 14
    assert sorted(o["device"] for o in ooms(m)) == [0, 1]
    assert [o["index"] for o in ooms(m) if o["device"] == drawn] == [13]
    assert [o["index"] for o in ooms(m) if o["device"] != drawn] == [-1]
    sub = select_device(trace, drawn)
    blocks, _ = replay(m, 13)
    ref = pool_state_at(sub.events, sub.mate, 14).block_index
    assert blocks.tolist() == sorted(ref.tolist()) == [2, 4, 6, 8]
