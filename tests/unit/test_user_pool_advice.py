"""A CuPy program's own ``MemoryPool``, with a limit the program set on it, is where its request failed:
advise answers that pool's question, on its rows alone at its own limit (``tracekit.advise.run.own_pool``),
never the default pool's at the device's size (which called the failure unexplained and blamed
"another process").

The hand-built recording (one device, one stream; MiB):

====  ==============  ====  =========================================================
row   op              pool  what
====  ==============  ====  =========================================================
0     segment_alloc   0     64 MiB for the default pool (no limit)
1     malloc          0     64 MiB, held to the end
2     segment_alloc   1     4 MiB for the user pool (``set_limit(8 MiB)``)
3     malloc          1     A: 4 MiB, held
4     segment_alloc   0     1 MiB
5     malloc          0     1 MiB, freed next
6     free            0     the 1 MiB
7     segment_alloc   1     2 MiB
8     malloc          1     B: 2 MiB, held
9     oom             1     C: 4 MiB: the pool holds 6 MiB, 6 + 4 > 8 (nothing free to release)
====  ==============  ====  =========================================================

Worked answer: the user pool alone needs 4 + 2 + 4 = 10 MiB through C, and nothing at its 8 MiB limit
fits it (every setting tried holds A and B there: 6 MiB, and C's 4 MiB does not fit beside them); so
the fit is the pool's limit raised, from 10 MiB. The default pool's 65 MiB never count: with them the
device's rows need 74 MiB (64 + 10), which is the answer a user's ``--limit`` gets (the default pool's
question, as before).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tracekit.advise.candidates import Kind
from tracekit.advise.result import AdviseResult, OwnLimit
from tracekit.advise.run import advise, own_limit
from tracekit.trace import Events, Op, Source, TraceMeta, read_trace, write_trace
from tracekit.trace.devices import pool_ids, select_pool
from tracekit.trace.outcome import failing_pool, held_limit
from tracekit.trace.reader import Trace

MiB = 1 << 20
SA, M, F, OOM = Op.SEGMENT_ALLOC, Op.MALLOC, Op.FREE, Op.OOM
USER_LIMIT = 8 * MiB
DEFAULT_LIMIT = 80 * MiB
OOM_MESSAGE = ("Out of memory allocating 4,194,304 bytes (allocated so far: 6,291,456 bytes, limit set to: "
               "8,388,608 bytes).")

# (op, MiB, pool, address): the table above
ROWS = [(SA, 64, 0, 0x1000_0000), (M, 64, 0, 0x1000_0000), (SA, 4, 1, 0x2000_0000), (M, 4, 1, 0x2000_0000),
        (SA, 1, 0, 0x1400_0000), (M, 1, 0, 0x1400_0000), (F, 1, 0, 0x1400_0000),
        (SA, 2, 1, 0x2040_0000), (M, 2, 1, 0x2040_0000), (OOM, 4, 1, 0)]
# The default pool's request that failed instead (the second trace): 32 MiB past its 80 MiB limit.
DEFAULT_OOM = (OOM, 32, 0, 0)


def _pools(user_limit: int | None) -> list[dict[str, Any]]:
    """The recorder's ``pools``: the default pool (its limit as left: ``DEFAULT_LIMIT``), the user's."""
    return [{"id": 0, "device": 0, "kind": "pool", "label": "default", "limit_bytes": DEFAULT_LIMIT},
            {"id": 1, "device": 0, "kind": "pool", "label": "user 1", "limit_bytes": user_limit}]


def build(tmp: Path, *, default_oom: bool = False, user_limit: int | None = USER_LIMIT,
          measured: bool = True, marked: bool = True) -> Trace:
    """The recording above, written by the project's writer and read back. ``default_oom``: the last row
    is the default pool's 32 MiB request instead; ``user_limit``: the user pool's ``pools`` limit
    (None: the entry does not say, as in a killed recording); ``measured``: an ``oom_states`` entry
    measured the failing pool's limit; ``marked``: the ``pool`` column is written."""
    rows = [*ROWS[:-1], DEFAULT_OOM] if default_oom else ROWS
    op = np.array([r[0] for r in rows], np.int8)
    size = np.array([r[1] for r in rows], np.uint64) * MiB
    addr = np.array([r[3] for r in rows], np.uint64)
    rounded = np.where((op == M) | (op == OOM), size, 0).astype(np.uint64)
    pool = np.array([r[2] for r in rows], np.uint16)
    ev = Events.build(op, size, addr=addr, rounded=rounded, stream=np.full(len(rows), 7, np.uint64),
                      site=np.where(op == OOM, 0, -1).astype(np.int32), sites=("prog.py:12",))
    seq, failed = len(rows) - 1, int(pool[-1])
    limit = DEFAULT_LIMIT if default_oom else USER_LIMIT
    held = int(size[:-1][(op[:-1] == SA) & (pool[:-1] == failed)].sum())
    message = OOM_MESSAGE if not default_oom else "Out of memory allocating 33,554,432 bytes."
    state = {"seq": seq, "device": 0, "mem_free": 100 << 30, "mem_total": 140 << 30,
             "pool": {"used_bytes": held, "total_bytes": held, "limit_bytes": limit}}
    extra = {
        "device_id": 0, "pools": _pools(user_limit), "oom_states": [state] if measured else [],
        "ooms": [{"seq": seq, "kind": "oom", "device": 0, "size": int(size[-1]), "rounded": int(size[-1]),
                  "exception": "OutOfMemoryError", "message": message, "pool_id": failed,
                  "used_bytes": held, "total_bytes": held, "limit": limit}],
        "exit": {"status": "exception", "exception": "cupy.cuda.memory.OutOfMemoryError", "code": 1,
                 "message": message, "oom_seq": seq},
        "rerun": {"argv": ["prog.py"], "module": False, "cwd": "/w", "limit_bytes": None},
    }
    meta = TraceMeta.new(Source.CUPY, pool_limit_bytes=None, extra=extra)
    name = f"user-pool{'-default' if default_oom else ''}{'' if marked else '-unmarked'}.parquet"
    return read_trace(write_trace(tmp / name, meta, ev, {"pool": pool} if marked else None))


@pytest.fixture
def user(tmp_path: Path) -> Trace:
    return build(tmp_path)


@pytest.fixture
def user_answer(user: Trace) -> AdviseResult:
    return advise(user, jobs=1)


def test_the_failing_pool_and_its_limit(tmp_path: Path, user: Trace) -> None:
    got = failing_pool(user.events, user.meta)
    assert got is not None and (got.pool.id, got.pool.label, got.limit) == (1, "user 1", USER_LIMIT)
    assert failing_pool(user.events, user.meta, device=0) == got
    assert held_limit(user.events, user.meta) == DEFAULT_LIMIT  # the default pool's: not this question
    unmeasured = build(tmp_path, measured=False)  # the pools entry says it
    assert failing_pool(unmeasured.events, unmeasured.meta) == replace(got, total=None, used=None)
    assert got.over_limit and got.request == 4 * MiB and got.total == 6 * MiB
    unknown = build(tmp_path, measured=False, user_limit=None)  # nothing says it: not named
    assert failing_pool(unknown.events, unknown.meta) is None
    none = build(tmp_path, measured=False, user_limit=0)  # CuPy's 0: the pool had no limit
    assert failing_pool(none.events, none.meta) is None
    default = build(tmp_path, default_oom=True)  # the default pool's request: not a user pool's
    assert failing_pool(default.events, default.meta) is None


def test_one_pools_rows_alone(user: Trace) -> None:
    assert pool_ids(user).tolist() == [r[2] for r in ROWS]
    one = select_pool(user, 1)
    assert one.events.op.tolist() == [SA, M, SA, M, OOM]
    assert (one.events.size // MiB).tolist() == [4, 4, 2, 2, 4]
    assert one.mate.tolist() == [-1, -1, -1, -1, -1]  # nothing of pool 1 freed; no pair cut
    assert pool_ids(one).tolist() == [1] * 5
    # its metadata is that pool's alone: the limit held at its failing request is its own
    assert [p.id for p in one.meta.recorded.pools] == [1]
    assert held_limit(one.events, one.meta) == USER_LIMIT
    zero = select_pool(user, 0)
    assert zero.events.op.tolist() == [SA, M, SA, M, F] and zero.mate.tolist()[-1] == 3


def test_advised_at_the_pools_own_limit_on_its_rows_alone(user_answer: AdviseResult) -> None:
    r = user_answer
    assert r.limit == USER_LIMIT
    assert r.pool is not None and (r.pool.id, r.pool.label, r.pool.limit, r.pool.alone) == \
        (1, "user 1", USER_LIMIT, True)
    assert r.failing_seq == len(ROWS) - 1
    # nothing at 8 MiB: A and B and C are 10 MiB; each replay counts pool 1's bytes only (never 64 MiB)
    assert r.tried and all(o.peak_reserved <= 10 * MiB for o in r.tried)
    assert not any(o.ok for o in r.tried if o.candidate.kind != Kind.CUPY_LIMIT)
    assert r.min_capacity == 10 * MiB and r.lower_bound == 10 * MiB
    fit = r.fits[0]
    assert fit.candidate.kind == Kind.CUPY_LIMIT and fit.peak_reserved == 10 * MiB
    assert fit.capacity is not None and fit.capacity > 10 * MiB
    assert r.own_limit == OwnLimit(USER_LIMIT, certain=True, pool=r.pool)


def test_the_recommendation_names_the_pool(user_answer: AdviseResult) -> None:
    text = user_answer.recommendation()
    assert text.startswith("The request failed in the program's own pool 'user 1' (pool 1 on device 0), at "
                           "the limit the program set on it (8.00 MiB); that pool replayed alone (each CuPy "
                           "pool has its own limit): CuPy pool, set_limit(")
    assert "fits with the pool limit raised to" in text
    cap = user_answer.fits[0].capacity
    assert text.endswith(f"rerun with: pool.set_limit(size={cap})  # pool: the program's own "
                         "cupy.cuda.MemoryPool 'user 1' (pool 1 on device 0), not the default pool")
    assert "get_default_memory_pool" not in text
    assert "does not explain" not in text and "another process" not in text
    assert "lifting the limit the program sets on its own pool 'user 1' (pool 1 on device 0) (8388608 bytes" \
        in text
    # the record command alone: advise --limit would ask the default pool's question
    (record,) = user_answer.whole_run_lines()
    assert record.startswith("tracekit record") and record in text and "tracekit advise" not in text
    table = user_answer.to_text()
    assert table.splitlines()[0] == ("pool 'user 1' (pool 1 on device 0), the program's own, at the limit "
                                     "the program set on it: its rows alone were replayed (each CuPy pool "
                                     "has its own limit)")
    assert "limit 8.00 MiB (8388608 bytes)" in table


def test_the_json_says_the_pool(user_answer: AdviseResult) -> None:
    doc = json.loads(json.dumps(user_answer.as_json()))
    assert doc["pool"] == {"id": 1, "device": 0, "label": "user 1", "limit_bytes": USER_LIMIT, "alone": True}
    assert doc["limit_bytes"] == USER_LIMIT
    assert all("get_default_memory_pool" not in f["line"] for f in doc["fits"])


def test_a_label_is_data(tmp_path: Path) -> None:
    """A pool's label comes from the trace: made safe before it is put in a sentence."""
    t = build(tmp_path)
    default, pool = _pools(USER_LIMIT)
    extra = {**t.meta.extra, "pools": [default, {**pool, "label": "u\n\x1b[31m"}]}

    r = advise(replace(t, meta=replace(t.meta, extra=extra)), jobs=1)
    assert r.pool is not None and r.pool.label == "u\n\x1b[31m"
    assert "\x1b" not in r.recommendation() and "\n" not in r.recommendation()


def test_a_default_pool_oom_is_the_default_pools_question(tmp_path: Path) -> None:
    """The same program, its default pool's request failing at the default pool's limit: the default
    pool's question, on its own rows alone (CuPy's ``set_limit`` holds the default pool's bytes, never
    the user pool's 6 MiB): 64 + 32 MiB live through the failing request."""
    t = build(tmp_path, default_oom=True)
    r = advise(t, jobs=1)
    assert r.pool is None and "pool" not in r.as_json() and r.limit == DEFAULT_LIMIT
    assert r.lower_bound == (64 + 32) * MiB
    # the freed 1 MiB segment is released at the limit (free_all_blocks), so 96 MiB, the default pool's
    assert r.min_capacity == (64 + 32) * MiB
    assert all(o.peak_reserved <= (64 + 1 + 32) * MiB for o in r.tried)
    assert not r.recommendation().startswith("The request failed in the program's own pool")


def test_a_users_limit_asks_the_default_pools_question(user: Trace) -> None:
    """``advise --limit``: today's question, every row of the device under the user's limit."""
    r = advise(user, limit=16 * MiB, jobs=1)
    assert r.pool is None and r.limit == 16 * MiB and "pool" not in r.as_json()
    assert r.lower_bound == (64 + 10) * MiB
    assert r.min_capacity is not None and r.min_capacity >= 74 * MiB
    assert "own pool" not in r.recommendation()
    # the program's own limit there is the default pool's (80 MiB, as the program left it), not pool 1's
    assert r.own_limit == own_limit(user) == OwnLimit(DEFAULT_LIMIT, certain=True)


def test_an_unmarked_trace_replays_every_row_under_the_pools_limit(tmp_path: Path) -> None:
    """No ``pool`` column: the pool's rows cannot be told apart, so every row of the device stands in for
    them at its limit (an upper estimate), said as such; still never "another process"."""
    r = advise(build(tmp_path, marked=False), jobs=1)
    assert r.pool is not None and not r.pool.alone and r.limit == USER_LIMIT
    text = r.recommendation()
    assert "the trace's pool column does not mark that pool's rows, so every row of the device" in text
    assert "another process" not in text and "get_default_memory_pool" not in text
    assert r.lower_bound == (64 + 10) * MiB


TRACES = Path(__file__).resolve().parents[2] / "traces"


def test_a_recording_whose_pool_was_the_programs_own(tmp_path: Path) -> None:
    """A real CuPy recording (``cupy-oom-frag-stacks``: its pool limited to 256 MiB, the fatal 64 MiB
    request over it) written again as if that pool were one the program made (every row in pool 1, its
    ``pools``/``ooms`` metadata to match, the default pool unused and unlimited): the same replays, at
    the same limit, now said of that pool."""
    t = read_trace(TRACES / "cupy-oom-frag-stacks.parquet")
    limit = t.meta.pool_limit_bytes
    assert limit == 256 * MiB
    extra = {**t.meta.extra,
             "pools": [{"id": 0, "device": 0, "kind": "pool", "label": "default", "limit_bytes": 0},
                       {"id": 1, "device": 0, "kind": "pool", "label": "user 1", "limit_bytes": limit}],
             "ooms": [{**o, "pool_id": 1} for o in t.meta.extra["ooms"]]}
    meta = TraceMeta.new(Source.CUPY, pool_limit_bytes=None, device=t.meta.device, extra=extra)
    assert t.extras is not None
    extras = {"pool": np.ones(len(t.events), np.uint16),
              "device_free": t.extras.column("device_free").combine_chunks()}
    own = read_trace(write_trace(tmp_path / "own.parquet", meta, t.events, extras))
    before, after = advise(t, jobs=1), advise(own, jobs=1)
    assert before.pool is None and after.pool is not None and after.pool.alone
    assert after.limit == before.limit == limit
    assert [(o.candidate.label(), o.verdict, o.peak_reserved) for o in after.tried] == \
        [(o.candidate.label(), o.verdict, o.peak_reserved) for o in before.tried]
    assert [o.candidate for o in after.fits] == [o.candidate for o in before.fits]
    assert "get_default_memory_pool" in before.recommendation()
    assert "get_default_memory_pool" not in after.recommendation()
    assert after.recommendation().startswith("The request failed in the program's own pool 'user 1' (pool 1 "
                                             "on device 0), at the limit the program set on it (256.00 MiB)")


def _with_extra(t: Trace, **keys: Any) -> Trace:
    return replace(t, meta=replace(t.meta, extra={**t.meta.extra, **keys}))


def test_a_pool_that_ran_out_of_the_device_under_its_limit_is_not_named(tmp_path: Path) -> None:
    """CuPy raises the same error ("limit set to" included) where the device refused the pool under its
    limit: the pool measured at the OOM (6 MiB + 4 MiB, under 1 GiB) says the limit was not what
    failed, so the question is not that pool's limit."""
    t = build(tmp_path)
    (state,) = t.meta.extra["oom_states"]
    default, pool = _pools(1 << 30)
    under = _with_extra(t, pools=[default, pool],
                        oom_states=[{**state, "pool": {**state["pool"], "limit_bytes": 1 << 30}}])
    got = failing_pool(under.events, under.meta)
    assert got is not None and got.limit == 1 << 30 and got.over_limit is False
    assert advise(under, jobs=1).pool is None
    # not measured: the pool's own rows say it (6 MiB reserved before the 4 MiB request)
    unmeasured = _with_extra(t, pools=[default, pool], oom_states=[])
    assert failing_pool(unmeasured.events, unmeasured.meta).over_limit is None  # type: ignore[union-attr]
    assert advise(unmeasured, jobs=1).pool is None
    assert advise(_with_extra(t, oom_states=[]), jobs=1).pool is not None  # at 8 MiB: 6 + 4 is over


def test_the_default_pool_is_the_one_labelled_so(tmp_path: Path) -> None:
    """The recorder numbers pools by first use: where the program's own pool was used first, it has
    the lowest id; the label says which is CuPy's default pool. A device where only the program's own
    pools were used has no default pool entry at all."""
    t = build(tmp_path)
    default, pool = _pools(USER_LIMIT)
    first = _with_extra(t, pools=[{**pool, "id": 0}, {**default, "id": 1}],
                        ooms=[{**o, "pool_id": 0} for o in t.meta.extra["ooms"]])
    got = failing_pool(first.events, first.meta)
    assert got is not None and got.pool.id == 0 and got.pool.label == "user 1"
    alone = _with_extra(t, pools=[pool])  # the default pool never used on this device
    got = failing_pool(alone.events, alone.meta)
    assert got is not None and got.pool.id == 1
    assert advise(alone, jobs=1).pool is not None


def test_a_pool_column_of_nulls_only(tmp_path: Path) -> None:
    """A ``pool`` column of Arrow's null type (a tool that rewrote the file): no pool told apart, no
    traceback; the failing pool named from the metadata, every row of the device standing in for it."""
    import pyarrow as pa

    t = build(tmp_path, marked=False)
    ev = t.events
    path = write_trace(tmp_path / "nulls.parquet", t.meta, ev, {"pool": pa.nulls(len(ev))})
    nulls = read_trace(path)
    assert pool_ids(nulls).tolist() == [0] * len(ev)
    r = advise(nulls, jobs=1)
    assert r.pool is not None and not r.pool.alone


def test_an_async_pool_at_its_own_limit_is_said(tmp_path: Path) -> None:
    """A ``MemoryAsyncPool`` of the program's, measured over the limit it set on it: advise models such a
    pool as the device allocator (no limit of its own to search), and says which pool ran out, and why,
    instead of blaming another process."""
    t = build(tmp_path)
    default, pool = _pools(USER_LIMIT)
    r = advise(_with_extra(t, pools=[default, {**pool, "kind": "async", "label": "async 1"}]), jobs=1)
    assert r.pool is None
    text = r.recommendation()
    assert "the request failed in the program's own MemoryAsyncPool 'async 1' (pool 1 on device 0)" in text
    assert "8.00 MiB; 6.00 MiB held, 4.00 MiB asked" in text and "another process" not in text


def test_the_default_pools_rows_only_where_they_account_for_it(tmp_path: Path) -> None:
    """The default pool's rows alone only where they hold what the pool was measured to hold at the
    failing request (65 MiB: its 64 and 1 MiB segments, marked as its own); a pool whose
    segments the recorder could not tell apart (a program that wraps its ``malloc``) measures more than
    its marked rows: every row of the device stays."""
    t = build(tmp_path, default_oom=True)
    (state,) = t.meta.extra["oom_states"]
    measured = _with_extra(t, oom_states=[{**state, "pool": {**state["pool"], "total_bytes": 65 * MiB}}])
    r = advise(measured, jobs=1)
    assert r.lower_bound == (64 + 32) * MiB
    assert any("the default pool's rows alone were replayed" in n for n in r.notes)
    other = _with_extra(t, oom_states=[{**state, "pool": {**state["pool"], "total_bytes": 90 * MiB}}])
    r = advise(other, jobs=1)
    assert r.lower_bound == (64 + 4 + 2 + 32) * MiB
    assert not any("the default pool's rows alone" in n for n in r.notes)


def test_pytorchs_allocator_is_its_devices_default_pool() -> None:
    """``record --torch`` labels each device's pool as PyTorch's caching allocator: that entry's limit is
    the one the run was held to (``advise --rerun`` compares it with the limit it asked for)."""
    from tracekit.trace.outcome import default_pool, pool_limit_of

    t = read_trace(TRACES / "fidelity" / "resnet35r-reruns" / "rerun-1.parquet")
    (entry,) = t.meta.recorded.pools
    assert default_pool(t.meta.recorded, 0) == entry and entry.label == "caching allocator"
    assert entry.limit and pool_limit_of(t.meta) == entry.limit


def test_a_pool_s_recorded_limit_is_its_own(tmp_path: Path) -> None:
    """``outcome.pool_limit``: the default pool's is its own (80 MiB), the user pool's its entry's; where
    the entry does not say it (a killed recording), the one measured at its OOM; none where neither."""
    from tracekit.trace.outcome import pool_limit

    def meta(name: str, **kw: Any) -> TraceMeta:
        (tmp_path / name).mkdir()
        return build(tmp_path / name, **kw).meta

    full = meta("a")
    assert pool_limit(full, 0, 0) == DEFAULT_LIMIT and pool_limit(full, 1, 0) == USER_LIMIT
    assert pool_limit(meta("b", user_limit=None), 1, 0) == USER_LIMIT  # measured at the OOM
    assert pool_limit(meta("c", user_limit=None, measured=False), 1, 0) is None
    assert pool_limit(meta("d", user_limit=0), 1, 0) is None  # CuPy's 0: no limit
