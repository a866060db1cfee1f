"""A PyTorch recording's limit that ``record --limit`` did not set: advise's command that records the
whole program once with room must say to lift it too, or the program caps the run where it died
(``tracekit.advise.run.own_limit``), on committed recordings of each kind."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from tracekit.advise.result import OwnLimit
from tracekit.advise.run import advise, own_limit
from tracekit.trace.reader import Trace, read_trace
from tracekit.trace.schema import Op, Source

TRACES = Path(__file__).resolve().parents[2] / "traces"


def test_record_limit_is_not_the_programs() -> None:
    """Recorded under ``record --torch --limit``: the limit is record's, nothing more to raise."""
    t = read_trace(TRACES / "torch-wlm.parquet")
    assert t.meta.recorded.rerun is not None and t.meta.recorded.rerun.limit_bytes == t.meta.pool_limit_bytes
    assert own_limit(t) is None


def test_the_programs_own_fraction() -> None:
    """``--fraction 0.035`` in the program, no ``--limit`` to record: the program's, certainly."""
    t = read_trace(TRACES / "torch-resnet35.parquet")
    assert t.meta.recorded.rerun is not None and t.meta.recorded.rerun.limit_bytes is None
    assert own_limit(t) == OwnLimit(5_253_845_811, certain=True)


def test_a_trace_that_does_not_say_how_it_ran() -> None:
    t = read_trace(TRACES / "torch-resnet-fraction.parquet")
    assert t.meta.recorded.rerun is None
    assert own_limit(t) == OwnLimit(4_503_296_409, certain=False)


RESNET35 = ("tracekit record --torch -o torch-resnet35-whole.parquet scripts/torch_workload_resnet.py "
            "--fraction 0.035, lifting the limit the program sets itself (5253845811 bytes in the recording) "
            "wherever the command sets it) and advise on that trace at the limit asked about (4.89 GiB: "
            "tracekit advise torch-resnet35-whole.parquet --limit 5253845811)")
FRACTION = "lifting any limit the program sets itself (4503296409 bytes in the recording) wherever"


@pytest.mark.parametrize(("name", "said"), [("torch-resnet35", RESNET35),
                                           ("torch-resnet-fraction", FRACTION)])
def test_the_command_to_record_the_whole_run_says_so(name: str, said: str) -> None:
    text = advise(read_trace(TRACES / f"{name}.parquet"), jobs=1).recommendation()
    assert said in text


def _with_rerun(t: Trace, pool_limit: int, record_limit: int | None) -> Trace:
    """``t`` as if recorded under ``record --limit record_limit`` and held to ``pool_limit`` all along:
    at the start, at each OOM, at the end."""
    rerun = {"argv": ["prog.py"], "module": False, "cwd": "/w", "limit_bytes": record_limit}
    return _held(replace(t, meta=replace(t.meta, pool_limit_bytes=pool_limit)), start=pool_limit,
                 at_oom=pool_limit, end=pool_limit, rerun=rerun)


def _held(t: Trace, *, start: int | None, at_oom: int | None, end: int | None,
          rerun: dict[str, object] | None = None) -> Trace:
    """``t`` with its pool limit at the start (``pool_limit_bytes``), measured at each OOM
    (``oom_states``) and as the program left each pool (``pools``) replaced; ``rerun`` as given."""
    extra = dict(t.meta.extra)
    extra["pools"] = [{**p, "limit_bytes": end} for p in extra.get("pools") or []]
    extra["oom_states"] = [{**s, "pool": {**(s.get("pool") or {}), "limit_bytes": at_oom}}
                           for s in extra.get("oom_states") or []]
    if rerun is not None:
        extra["rerun"] = rerun
    return replace(t, meta=replace(t.meta, pool_limit_bytes=start, extra=extra))


@pytest.mark.parametrize(("pool", "record", "want"), [
    (4_294_967_295, 4_294_967_296, None),  # record --torch --limit 4GiB, as PyTorch gives the fraction back
    (4_294_967_296, 4_294_967_296, None),
    (3_000_000_000, 4_294_967_296, OwnLimit(3_000_000_000, certain=True)),  # the program's own, below
    (3_000_000_000, None, OwnLimit(3_000_000_000, certain=True)),
    (0, None, None),  # no limit in the recording
])
def test_whose_limit(pool: int, record: int | None, want: OwnLimit | None) -> None:
    t = read_trace(TRACES / "torch-wlm.parquet")
    assert own_limit(_with_rerun(t, pool, record)) == want


def test_the_limit_asked_about_is_the_users() -> None:
    """``advise --limit``: the whole run is advised on at the user's limit, the program's own still lifted."""
    text = advise(read_trace(TRACES / "torch-resnet35.parquet"), limit=4 << 30, jobs=1).recommendation()
    assert ("at the limit asked about (4.00 GiB: tracekit advise torch-resnet35-whole.parquet "
            "--limit 4294967296)") in text
    assert "lifting the limit the program sets itself (5253845811 bytes in the recording)" in text


def test_a_raised_cupy_pool_limit_on_a_run_that_died() -> None:
    text = advise(read_trace(TRACES / "cupy-oom-frag.parquet"), limit=150 << 20, jobs=1).recommendation()
    assert "fits with the pool limit raised to" in text
    assert ("record the whole run once with room to finish (tracekit record -o cupy-oom-frag-whole.parquet "
            "scripts/record_workloads.py oom, lifting any limit the program sets itself (268435456 "
            "bytes") in text
    assert "--torch" not in text
    assert text.count("record the whole run") == 1 and text.count("through the failing request") == 1
    assert "; rerun with: cupy.get_default_memory_pool().set_limit(size=" in text  # the line, last


def test_a_raw_trace_is_not_told_to_record_with_tracekit() -> None:
    """No ``tracekit record`` command records a synthetic or imported trace: the sentence says what to do."""
    t = read_trace(TRACES / "cupy-oom-frag.parquet")
    raw = replace(t, meta=replace(t.meta, source=Source.SYNTHETIC))
    text = advise(raw, limit=200 << 20, jobs=1).recommendation()
    assert "the smallest capacity is" in text
    assert ("record the whole run once with room to finish and advise on that trace at the limit asked about "
            "(200.00 MiB: tracekit advise cupy-oom-frag-whole.parquet --limit 209715200)") in text
    assert "tracekit record" not in text
    assert text.count("record the whole run") == 1 and text.endswith(".")


# A CuPy program that calls ``set_limit`` itself once recording has begun: the recorder read no limit
# at the start, and the pool's limit is in the trace only as measured at the OOM and as the program
# left the pool. Advise must answer at that limit (``trace.outcome.held_limit``), as it does where the
# limit was there from the start; before, it advised at the device's 139.80 GiB and called the OOM
# unexplained.
LIMIT = 256 << 20


def test_a_limit_the_program_set_itself_is_the_limit_advised_at() -> None:
    t = read_trace(TRACES / "cupy-oom-frag-stacks.parquet")
    assert t.meta.pool_limit_bytes == LIMIT
    rerun = {"argv": ["scripts/record_workloads.py", "oom"], "module": False, "cwd": "/w",
             "limit_bytes": None}
    own = _held(t, start=None, at_oom=LIMIT, end=LIMIT, rerun=rerun)
    before, after = advise(t, jobs=1), advise(own, jobs=1)
    assert after.limit == before.limit == LIMIT
    assert [(o.candidate.label(), o.verdict, o.peak_reserved) for o in after.tried] == \
        [(o.candidate.label(), o.verdict, o.peak_reserved) for o in before.tried]
    assert after.fits and after.fits[0].candidate == before.fits[0].candidate
    assert own_limit(own) == OwnLimit(LIMIT, certain=True)  # no record --limit: the program's own
    assert "lifting the limit the program sets itself (268435456 bytes in the recording)" in \
        after.recommendation()


@pytest.mark.parametrize(("start", "at_oom", "end", "want"), [
    (None, LIMIT, LIMIT, LIMIT),  # set by the program after the start
    (LIMIT, 300 << 20, 300 << 20, 300 << 20),  # record --limit, then the program's own: the OOM's
    (None, 200 << 20, 300 << 20, 200 << 20),  # raised after the failing request: the one it failed at
    (None, None, LIMIT, LIMIT),  # not measured at the OOM: as the program left the pool
    (LIMIT, None, 0, None),  # the program lifted it: the pool as it was left has none (CuPy's 0)
    (LIMIT, None, None, LIMIT),  # a killed recording: its pools entries do not say; record's limit
])
def test_the_limit_held_to(start: int | None, at_oom: int | None, end: int | None, want: int | None) -> None:
    from tracekit.trace.outcome import held_limit

    t = _held(read_trace(TRACES / "cupy-oom-frag-stacks.parquet"), start=start, at_oom=at_oom, end=end)
    assert held_limit(t.events, t.meta) == want
    assert held_limit(t.events, t.meta, device=0) == want


def test_without_pools_or_states_the_start_limit() -> None:
    """A trace with neither (an older recording, a replay's output): the limit at the start."""
    t = read_trace(TRACES / "cupy-oom-frag.parquet")
    assert not t.meta.recorded.oom_states and not t.meta.recorded.pool_limits
    from tracekit.trace.outcome import held_limit

    assert held_limit(t.events, t.meta) == LIMIT
    assert held_limit(t.events, replace(t.meta, pool_limit_bytes=None)) is None


def test_a_user_pools_own_limit_is_not_the_default_pools() -> None:
    """The failing request was a user pool's (``ooms`` names its pool), which had a limit of its own:
    no setting of the default pool answers that, so the default pool's limit (none) is the one held."""
    from tracekit.trace.outcome import held_limit

    t = _held(read_trace(TRACES / "cupy-oom-frag-stacks.parquet"), start=None, at_oom=4 << 20, end=0)
    extra = dict(t.meta.extra)
    extra["pools"] = [*extra["pools"], {"id": 1, "device": 0, "kind": "pool", "label": "user 1",
                                        "limit_bytes": 4 << 20}]
    extra["ooms"] = [{**o, "pool_id": 1} for o in extra["ooms"]]
    user = replace(t, meta=replace(t.meta, extra=extra))
    assert held_limit(user.events, user.meta) is None
    extra["ooms"] = [{**o, "pool_id": 0} for o in extra["ooms"]]  # the default pool's: its measured limit
    default = replace(t, meta=replace(t.meta, extra=extra))
    assert held_limit(default.events, default.meta) == 4 << 20


def test_each_device_is_held_to_its_own_default_pool() -> None:
    """A trace's part on device 1 (``trace.devices.split_devices`` keeps the metadata, which describes
    device 0): device 1's default pool, not the start's limit of device 0."""
    from tracekit.trace.outcome import held_limit

    t = read_trace(TRACES / "cupy-mlp.parquet")
    assert not (t.events.op == Op.OOM).any()
    extra = {**t.meta.extra, "device_id": 0, "pools": [
        {"id": 0, "device": 0, "kind": "pool", "label": "default", "limit_bytes": 8 << 20},
        {"id": 1, "device": 1, "kind": "pool", "label": "default", "limit_bytes": 0}]}
    meta = replace(t.meta, pool_limit_bytes=8 << 20, extra=extra)
    on1 = replace(t.events, device=np.ones(len(t.events), t.events.device.dtype))
    assert held_limit(on1, meta) is None and held_limit(on1, meta, device=1) is None
    assert held_limit(t.events, meta) == 8 << 20 and held_limit(on1, meta, device=0) == 8 << 20
