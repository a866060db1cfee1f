"""The browser report's data model, checked as data: columns, levels of detail, state replay, escaping.

The hand trace (``page_trace``): one 64 MiB segment at ``BASE`` filled by eight 8 MiB
blocks (event indices 1..8, call-site i % 3), the even ones freed (events 9..12), then a
16 MiB request fails (event 13). Right after event 12 the live blocks are the mallocs at
events 2, 4, 6, 8 (offsets 8, 24, 40, 56 MiB) and the largest free block is 8 MiB.
The state the page would show is rebuilt here from the model's columns alone (``replay``:
keyframe, then the window's events) and compared with the analyzer's ``pool_state_at``.
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
from tracekit.analysis.leaks import pool_state_at
from tracekit.report.page import lod, state, write_page
from tracekit.report.page.callsites import parse_site
from tracekit.report.page.columns import column, decode
from tracekit.report.page.data import build_model
from tracekit.report.page.html import csp, model_json, page
from tracekit.trace import Op, read_trace, write_trace

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cli"))  # shared hand-built traces
from test_report import SITES, hand_trace

MiB = 1 << 20
HOSTILE = (
    "evil/<script>alert(1)</script>.py:1:f",
    "x.py:2:</style><b id=pwn>bold</b>",
    'y.py:3:"><img src=x onerror=alert(1)>',
)


def page_trace(path: Path, sites: tuple[str, ...] = SITES, *, oom: bool = True) -> Path:
    """The trace of the module docstring (``test_report.hand_trace``), call-sites replaced by ``sites``."""
    hand_trace(path, oom=oom)
    if sites != SITES:
        t = read_trace(path)
        write_trace(path, t.meta, dataclasses.replace(t.events, sites=sites))
    return path


def read_model(html_path: Path) -> dict[str, Any]:
    """The JSON model embedded in a written page."""
    text = html_path.read_text(encoding="utf-8")
    m = re.search(r'<script type="application/json" id="model">(.*?)</script>', text, re.S)
    assert m is not None
    return dict(json.loads(m.group(1)))


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
    assert m["stacks"] == {"frame": [0, 1, 2], "parent": [-1, -1, -1]}
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


def test_parse_site() -> None:
    assert parse_site("tv/models/resnet.py:151:forward") == ("tv/models/resnet.py", 151, "forward")
    assert parse_site("a.py:12") == ("a.py", 12, "")
    assert parse_site("<unknown>") == ("<unknown>", -1, "")
    assert parse_site("C:/x/a.py:3:f") == ("C:/x/a.py", 3, "f")


def test_hostile_call_sites_stay_data(tmp_path: Path) -> None:
    """No string from the trace can end the JSON element or add markup; the CSP names only hashes."""
    out = write_page(page_trace(tmp_path / "h.parquet", HOSTILE), tmp_path / "h.html")
    text = out.read_text(encoding="utf-8")
    body = text.split('id="model">', 1)[1].split("</script>", 1)[0]
    assert "<" not in body  # every < is \u003c inside the JSON
    assert "<img" not in text and "<b id=pwn>" not in text and text.count("<script") == 3
    m = read_model(out)
    assert m["frames"]["file"][0] == "evil/<script>alert(1)</script>.py"
    assert m["frames"]["function"][2] == '"><img src=x onerror=alert(1)>'
    policy = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', text)
    assert policy is not None
    assert policy.group(1).startswith("default-src 'none'; script-src 'sha256-")
    assert "unsafe" not in policy.group(1) and "http" not in policy.group(1)


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
