"""One pool's rows alone (``trace.devices.select_pool`` / ``only_pool``, what ``replay --pool``,
``whatif --pool`` and advise's own-pool question replay): properties over random traces of several
CuPy pools interleaved, written by the project's writer and read back.

Each pool has an address range of its own (as CuPy's pools never share memory); a pool's blocks are
taken and given back in an order drawn at random, interleaved with the other pools' at random.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tracekit.errors import InputError
from tracekit.trace import Events, Op, Source, TraceMeta, read_trace, write_trace
from tracekit.trace.devices import only_pool, pool_ids, select_pool
from tracekit.trace.reader import Trace

POOL_BASE = 1 << 36  # pool p's blocks at p * POOL_BASE + ...: ranges that never meet


@st.composite
def pool_programs(draw: st.DrawFn) -> list[tuple[int, int, int, int]]:
    """Rows (op, size, addr, pool): per pool, blocks malloc'd and freed in a drawn order (some left
    live at the end), the pools' rows interleaved in a drawn order."""
    n_pools = draw(st.integers(1, 3))
    queues: list[list[tuple[int, int, int, int]]] = []
    for p in range(n_pools):
        sizes = draw(st.lists(st.integers(1, 64), min_size=1, max_size=12))
        rows: list[tuple[int, int, int, int]] = []
        live: list[tuple[int, int]] = []
        for i, s in enumerate(sizes):
            addr = p * POOL_BASE + i * (1 << 20)
            rows.append((Op.MALLOC, s * 512, addr, p))
            live.append((addr, s * 512))
            while live and draw(st.booleans()):  # free some live block, drawn
                a, size = live.pop(draw(st.integers(0, len(live) - 1)))
                rows.append((Op.FREE, size, a, p))
        queues.append(rows)
    order = draw(st.permutations([p for p, q in enumerate(queues) for _ in q]))
    out, heads = [], [0] * n_pools
    for p in order:
        out.append(queues[p][heads[p]])
        heads[p] += 1
    return out


def _write(tmp: Path, rows: list[tuple[int, int, int, int]]) -> Trace:
    op = np.array([r[0] for r in rows], np.int8)
    size = np.array([r[1] for r in rows], np.uint64)
    ev = Events.build(op, size, addr=np.array([r[2] for r in rows], np.uint64), rounded=size)
    pools = sorted({r[3] for r in rows})
    extra = {"device_id": 0, "pools": [{"id": p, "device": 0, "kind": "pool",
                                        "label": "default" if p == 0 else f"user {p}", "limit_bytes": 0}
                                       for p in pools]}
    meta = TraceMeta.new(Source.CUPY, pool_limit_bytes=None, extra=extra)
    pool = np.array([r[3] for r in rows], np.uint16)
    return read_trace(write_trace(tmp / f"pools-{len(rows)}.parquet", meta, ev, {"pool": pool}))


@settings(max_examples=60, deadline=None)
@given(rows=pool_programs())
def test_each_pool_alone_is_its_rows_in_order_paired_among_themselves(
        tmp_path_factory: pytest.TempPathFactory, rows: list[tuple[int, int, int, int]]) -> None:
    trace = _write(tmp_path_factory.mktemp("pools"), rows)
    ids = pool_ids(trace)
    assert ids.tolist() == [r[3] for r in rows]
    total = 0
    for p in sorted(set(ids.tolist())):
        sub = only_pool(trace, p)
        mine = np.flatnonzero(ids == p)
        total += len(sub.events)
        # its rows, in the order they were recorded, and only those
        assert sub.events.seq.tolist() == trace.events.seq[mine].tolist()
        assert (pool_ids(sub) == p).all()
        # each free paired with its own malloc, as in the whole trace (pairs never cross pools)
        whole = {int(trace.events.seq[i]): int(trace.events.seq[m])
                 for i, m in enumerate(trace.mate) if m >= 0 and ids[i] == p}
        alone = {int(sub.events.seq[i]): int(sub.events.seq[m]) for i, m in enumerate(sub.mate) if m >= 0}
        assert alone == whole
        # the metadata describes that pool alone
        assert [e.id for e in sub.meta.recorded.pools] == [p]
    assert total == len(trace.events)


def test_a_pool_with_no_rows_is_refused_naming_the_pools(tmp_path: Path) -> None:
    trace = _write(tmp_path, [(Op.MALLOC, 512, 0, 0), (Op.MALLOC, 1024, POOL_BASE, 1)])
    said = r"pool 2 has no events there; its pools: 0 \('default'\), 1 \('user 1'\)"
    with pytest.raises(InputError, match=said):
        only_pool(trace, 2)
    assert select_pool(trace, 1).events.size.tolist() == [1024]


def test_a_label_from_the_trace_is_shown_as_data(tmp_path: Path) -> None:
    """A label is the program's text: shown quoted with its control characters escaped, never sent to
    the terminal as they are."""
    rows = [(Op.MALLOC, 512, 0, 0)]
    trace = _write(tmp_path, rows)
    extra = {**trace.meta.extra, "pools": [{"id": 0, "device": 0, "kind": "pool", "label": "\x1b[31mred"}]}
    meta = TraceMeta.new(Source.CUPY, pool_limit_bytes=None, extra=extra)
    pool = {"pool": np.zeros(1, np.uint16)}
    odd = read_trace(write_trace(tmp_path / "odd.parquet", meta, trace.events, pool))
    with pytest.raises(InputError) as e:
        only_pool(odd, 5)
    assert "\x1b" not in str(e.value) and "\\x1b[31mred" in str(e.value)
