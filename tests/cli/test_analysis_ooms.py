"""Every OOM, which one was fatal, who handled the others; and a trace of two devices, each on its own."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from tracekit.analysis import Diagnosis, analyze_trace
from tracekit.cli.app import app
from tracekit.errors import InputError
from tracekit.trace import DeviceInfo, Events, Op, Source, TraceMeta, write_trace
from tracekit.trace.devices import select_device, single_device
from tracekit.trace.reader import Trace, read_trace
from tracekit.trace.validate import pair_events

MiB, GiB = 1 << 20, 1 << 30
BASE = 0x7F00_0000_0000
CONV = "torch/nn/modules/conv.py:456:_conv_forward"
SITES = (CONV, "model.py:20:forward")


def trace_of(rows: list[tuple], meta: TraceMeta) -> Trace:
    """rows: (op, addr, size, site, device) -> an in-memory Trace paired like the reader."""
    ev = Events.build(
        np.array([r[0] for r in rows], np.int8), np.array([r[2] for r in rows], np.uint64),
        addr=np.array([r[1] for r in rows], np.uint64), rounded=np.array([r[2] for r in rows], np.uint64),
        site=np.array([r[3] for r in rows]), device=np.array([r[4] for r in rows], np.int16), sites=SITES,
    )
    p = pair_events(ev.op, ev.addr, ev.device, ev.seq)
    assert p.keep.all()
    return Trace(None, meta, ev, p.mate, None, ())


def cudnn_rows() -> list[tuple]:
    """A 1 GiB pool: three workspace attempts fail and a smaller one succeeds each time (handled);
    then the forward pass asks for 2 GiB and nothing follows but frees (fatal)."""
    rows: list[tuple] = [(Op.SEGMENT_ALLOC, BASE, GiB, -1, 0), (Op.MALLOC, BASE, 512 * MiB, 1, 0)]
    for i in range(3):
        a = BASE + 512 * MiB + i * 64 * MiB
        rows += [(Op.OOM, 0, 4 * GiB, 0, 0), (Op.MALLOC, a, 64 * MiB, 0, 0)]
    rows += [(Op.OOM, 0, 2 * GiB, 1, 0), (Op.FREE, BASE, 512 * MiB, -1, 0)]
    return rows


def test_handled_and_fatal_from_what_followed():
    # No exit record: the OOMs at seq 2, 4, 6 were each followed by a malloc on the same device
    # and stream, so the program survived them; after seq 8 only a free came: fatal.
    s = analyze_trace(trace_of(cudnn_rows(), TraceMeta.new(Source.TORCH)), timeline=False).summary
    assert [o.seq for o in s.ooms] == [2, 4, 6, 8]
    assert [o.handled for o in s.ooms] == [True, True, True, False]
    assert s.oom is not None and s.oom.seq == 8 and not s.oom.handled and s.oom.site == SITES[1]
    d = s.to_dict()
    assert d["oom_events"] == 4 and d["handled_ooms"] == 3
    # One-frame stacks (format 1/2): the request's frame is the site itself; a frame of PyTorch's
    # own is never the user's code.
    assert d["handled_by"] == [{"site": CONV, "user_site": None, "request_site": CONV,
                                "handler": d["handled_by"][0]["handler"], "count": 3, "sizes": [4 * GiB] * 3}]
    assert "cuDNN" in d["handled_by"][0]["handler"]
    assert [o["handled"] for o in d["ooms"]] == [True, True, True, False]
    assert {"seq", "device", "size", "site", "diagnosis", "handled"} <= set(d["ooms"][0])
    text = s.to_text()
    assert "seq 8 on device 0 (fatal: the program died of it)" in text
    assert "4, of which 3 handled and 1 fatal" in text
    assert f"3 x {CONV} (convolution workspace attempts" in text
    assert "less): 4.00 GiB, 4.00 GiB, 4.00 GiB)" in text


def test_exit_record_names_the_fatal_oom():
    # The recorder's exit record says seq 4 ended the program (e.g. the later ones ran in
    # an exception handler): it wins over what followed.
    meta = TraceMeta.new(Source.CUPY).with_extra(exit={"status": "exception", "oom_seq": 4})
    s = analyze_trace(trace_of(cudnn_rows(), meta), timeline=False).summary
    assert s.oom is not None and s.oom.seq == 4
    assert [o.handled for o in s.ooms] == [True, False, True, True]


def test_a_program_that_survived_every_oom_reports_the_first_as_handled():
    meta = TraceMeta.new(Source.CUPY).with_extra(exit={"status": "ok", "code": 0, "oom_seq": None})
    s = analyze_trace(trace_of(cudnn_rows(), meta), timeline=False).summary
    assert s.oom is not None and s.oom.seq == 2 and s.oom.handled
    assert all(o.handled for o in s.ooms)
    assert "seq 2 on device 0 (survived: the program went on)" in s.to_text()


def test_version_1_exit_message_matches_an_oom_entry():
    msg = "Out of memory allocating 2,147,483,648 bytes"
    meta = TraceMeta.new(Source.CUPY).with_extra(
        exit={"code": 1, "exception": "OutOfMemoryError", "message": msg},
        ooms=[{"seq": 2, "message": "other"}, {"seq": 6, "message": msg}])
    s = analyze_trace(trace_of(cudnn_rows(), meta), timeline=False).summary
    assert s.oom is not None and s.oom.seq == 6


def two_device_rows() -> list[tuple]:
    """Device 0: an 8 MiB segment with four 2 MiB blocks. Device 1 (pool limit 256 MiB, same
    virtual addresses as device 0): 40 + 40 + 100 + 60 MiB segments and blocks = 240 MiB
    reserved, then 60 MiB more: 300 MiB > 256 MiB, the limit."""
    rows: list[tuple] = [(Op.SEGMENT_ALLOC, BASE, 8 * MiB, -1, 0)]
    rows += [(Op.MALLOC, BASE + i * 2 * MiB, 2 * MiB, 1, 0) for i in range(4)]
    a = BASE
    for size in (40, 40, 100, 60):
        rows += [(Op.SEGMENT_ALLOC, a, size * MiB, -1, 1), (Op.MALLOC, a, size * MiB, 1, 1)]
        a += size * MiB
    rows += [(Op.OOM, 0, 60 * MiB, 1, 1)]
    return rows


def two_device_meta() -> TraceMeta:
    pools = [{"id": 0, "device": 0, "kind": "pool", "label": "default", "limit_bytes": None},
             {"id": 0, "device": 1, "kind": "pool", "label": "default", "limit_bytes": 256 * MiB}]
    return TraceMeta.new(Source.CUPY, device=DeviceInfo("H200", 140 * GiB, 139 * GiB)).with_extra(
        pools=pools, device_id=0)


def test_two_devices_each_their_own_pool_limit_and_verdict():
    r = analyze_trace(trace_of(two_device_rows(), two_device_meta()))
    s = r.summary
    assert [p.device for p in s.devices] == [0, 1]
    d0, d1 = s.devices
    assert d0.peak_reserved_bytes == 8 * MiB and d0.peak_live_bytes == 8 * MiB and d0.oom is None
    assert d1.peak_reserved_bytes == 240 * MiB and d1.context.limit == 256 * MiB
    assert s.device == 1 and s.oom is not None and s.oom.device == 1
    assert s.oom.diagnosis is Diagnosis.LIMIT and s.oom.reserved_bytes == 240 * MiB
    assert "over its pool limit of 256.00 MiB" in s.oom.explanation
    d = s.to_dict()
    assert d["device"] == 1 and [x["device"] for x in d["devices"]] == [0, 1]
    assert d["oom"]["device"] == 1 and d["ooms"][0]["device"] == 1
    tl = r.timeline
    assert tl is not None and tl.column("seq").to_pylist() == list(range(14))
    dev = np.array(tl.column("device").to_pylist())
    res = np.array(tl.column("reserved_bytes").to_pylist())
    assert res[dev == 0].max() == 8 * MiB and res[dev == 1].max() == 240 * MiB
    assert "== device 1 ==" in s.to_text()


def test_select_device_and_single_device():
    tr = trace_of(two_device_rows(), two_device_meta())
    one = select_device(tr, 1)
    assert len(one.events) == 9 and set(one.events.device.tolist()) == {1}
    assert single_device(select_device(tr, 0), "x") is not None
    try:
        single_device(tr, "a simulated replay")
    except InputError as e:
        assert "2 devices (0, 1)" in str(e) and "never merged" in str(e)
    else:
        raise AssertionError("a mixed trace was accepted")


def _write_two_devices(tmp_path: Path) -> Path:
    tr = trace_of(two_device_rows(), two_device_meta())
    return write_trace(tmp_path / "two.parquet", tr.meta, tr.events)


def test_cli_analyze_two_devices_and_replay_refuses(tmp_path: Path):
    path = _write_two_devices(tmp_path)
    res = CliRunner().invoke(app, ["analyze", str(path), "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    assert d["oom"]["device"] == 1 and d["oom"]["diagnosis"] == "limit"
    assert read_trace(path).events.device.tolist().count(1) == 9
    p = subprocess.run([sys.executable, "-m", "tracekit", "replay", str(path), "--sim", "cupy"],
                       capture_output=True, text=True)
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert "events are on 2 devices (0, 1)" in p.stderr


def test_the_limit_is_the_raising_pools_own():
    # Device 0 has two pools: pool 0 (limit 256 MiB) holds a 200 MiB segment, pool 1 (no
    # limit) a 100 MiB one. A 100 MiB request of pool 1 fails. Pool 0's limit does not bind
    # it: charging the request to pool 0 would give 200 + 100 + 100 MiB > 256 MiB, `limit`.
    import pyarrow as pa

    rows = [(Op.SEGMENT_ALLOC, BASE, 200 * MiB, -1, 0), (Op.MALLOC, BASE, 200 * MiB, 1, 0),
            (Op.SEGMENT_ALLOC, BASE + GiB, 100 * MiB, -1, 0), (Op.MALLOC, BASE + GiB, 100 * MiB, 1, 0),
            (Op.OOM, 0, 100 * MiB, 1, 0)]
    pools = [{"id": 0, "device": 0, "kind": "pool", "label": "default", "limit_bytes": 256 * MiB},
             {"id": 1, "device": 0, "kind": "pool", "label": "user 1", "limit_bytes": None}]
    meta = TraceMeta.new(Source.CUPY, pool_limit_bytes=256 * MiB,
                         device=DeviceInfo("small", 400 * MiB, 400 * MiB)).with_extra(pools=pools)
    tr = trace_of(rows, meta)
    pool = pa.table({"pool": pa.array([0, 0, 1, 1, 1], pa.uint16())})
    s = analyze_trace(Trace(None, meta, tr.events, tr.mate, pool, ()), timeline=False).summary
    assert s.oom is not None and s.oom.diagnosis is not Diagnosis.LIMIT
    # Without the pool column the OOM would be charged to the default pool and its limit.
    s0 = analyze_trace(tr, timeline=False).summary
    assert s0.oom is not None and s0.oom.diagnosis is Diagnosis.LIMIT


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([Op.MALLOC, Op.OOM, Op.FREE]), st.integers(0, 2),
                          st.integers(0, 3)), min_size=1, max_size=40),
       st.sampled_from([0, 8]))
def test_went_on_matches_a_direct_search(rows: list[tuple[int, int, int]], masked: int):
    # went_on[i]: some malloc after OOM i on its device and stream; both search paths agree.
    from tracekit.trace import outcome

    ops = np.array([r[0] for r in rows], np.int8)
    if not (ops == Op.OOM).any():
        return
    ev = Events.build(ops, np.ones(len(rows), np.uint64), addr=np.arange(1, len(rows) + 1, dtype=np.uint64),
                      device=np.array([r[1] for r in rows], np.int16), stream=np.array([r[2] for r in rows]))
    ooms = np.flatnonzero(ops == Op.OOM)
    want = [any(o == Op.MALLOC and d == rows[i][1] and s == rows[i][2] for o, d, s in rows[i + 1:])
            for i in ooms]
    old = outcome.MASKED_KEYS
    outcome.MASKED_KEYS = masked
    try:
        assert outcome._went_on(ev, ooms).tolist() == want
    finally:
        outcome.MASKED_KEYS = old


def test_a_retry_at_the_same_call_site_names_the_caller():
    # The same attempts made from model.py: no library name in the call-site, but each OOM is
    # followed by a smaller malloc from the same call-site, so the caller retried smaller.
    from tracekit.analysis.fatal import RETRIED

    rows = [(o, a, s, 1 if site == 0 else site, d) for o, a, s, site, d in cudnn_rows()]
    s = analyze_trace(trace_of(rows, TraceMeta.new(Source.TORCH)), timeline=False).summary
    assert [o.handler for o in s.ooms] == [RETRIED, RETRIED, RETRIED, None]
    assert s.handled_by() == [{"site": SITES[1], "user_site": SITES[1], "request_site": SITES[1],
                               "handler": RETRIED, "count": 3, "sizes": [4 * GiB] * 3}]


def test_split_devices_equals_select_device():
    import pyarrow as pa

    from tracekit.trace.devices import split_devices

    # Both devices free the block at the same address BASE: each free pairs on its own device.
    rows = [*two_device_rows(), (Op.FREE, BASE, 2 * MiB, -1, 0), (Op.FREE, BASE, 40 * MiB, -1, 1)]
    zero, one = [r for r in rows if r[4] == 0], [r for r in rows if r[4] == 1]
    mixed = [r for pair in zip(one, zero, strict=False) for r in pair] + one[len(zero):]  # interleaved
    tr = trace_of(mixed, two_device_meta())
    tr = Trace(None, tr.meta, tr.events, tr.mate, pa.table({"x": np.arange(len(tr.events))}), ())
    parts = split_devices(tr)
    assert [d for d, _ in parts] == [0, 1]
    for d, sub in parts:
        ref = select_device(tr, d)
        assert np.array_equal(sub.events.seq, ref.events.seq) and np.array_equal(sub.mate, ref.mate)
        assert sub.extras is not None and ref.extras is not None
        assert sub.extras.column("x").to_pylist() == ref.extras.column("x").to_pylist()
        assert (sub.mate >= 0).sum() == 2  # the free and its malloc point at each other
        frees = np.flatnonzero(sub.events.op == Op.FREE)
        assert len(frees) == 1 and sub.events.addr[sub.mate[frees[0]]] == BASE
        assert sub.events.op[sub.mate[frees[0]]] == Op.MALLOC
