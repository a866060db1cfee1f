"""The torch device replay's pieces that need no GPU: settings, limit, history rows, starting state.

Worked examples: the settings string PyTorch is given for each committed
trace, the exact memory fraction for a byte limit, PyTorch's history entries
of a tiny replay turned into rows before the right requests, the pieces a
wrapped starting state is carved into, and the CLI's answers without PyTorch.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from tracekit.cli.app import app
from tracekit.device.torch_initial import _pieces
from tracekit.device.torch_loop import attach, closing_requests, history_of
from tracekit.device.torch_settings import fraction_for, plan_settings
from tracekit.errors import DeviceError, UsageError
from tracekit.importers import torch_columns as tc
from tracekit.importers.torch_stacks import StackBuilder
from tracekit.sim.base import Status
from tracekit.trace import Op, read_meta

ROOT = Path(__file__).resolve().parents[2]
MiB = 1 << 20


def _recorded(name: str) -> dict:
    return read_meta(ROOT / "traces" / name).extra["torch_allocator_settings"]


def test_settings_string_names_every_sticky_key() -> None:
    plan = plan_settings(_recorded("torch-tuned.parquet"), {})
    assert plan.conf == ("expandable_segments:False,max_non_split_rounding_mb:20,max_split_size_mb:128,"
                         "roundup_power2_divisions:[1:4,2:4,4:4,8:4,16:4,32:4,64:4,128:4,256:4,512:4,1024:4,"
                         "2048:4,4096:4,8192:4,16384:4,32768:4]")
    assert plan.expected.max_split_size == 128 * MiB and plan.release_points
    plain = plan_settings(_recorded("torch-train.parquet"), {})
    assert plain.conf == "expandable_segments:False,max_non_split_rounding_mb:20"


def test_given_settings_override_recorded_ones_and_tracekit_keys_stay_out() -> None:
    plan = plan_settings(_recorded("torch-expandable.parquet"),
                         {"expandable_segments": "False", "release_points": "none", "addresses": "invent"})
    assert plan.conf == "expandable_segments:False,max_non_split_rounding_mb:20"
    assert not plan.release_points
    assert plan.options["release_points"] == "none"


@pytest.mark.parametrize(("conf", "match"), [
    ({"max_split_size_mb": "10"}, "must be > 20"),
    ({"bogus": "1"}, "unknown torch allocator option"),
    ({"expandable_segments": "True", "max_split_size_mb": "256"}, "does not support"),
])
def test_bad_settings_are_usage_errors(conf: dict, match: str) -> None:
    with pytest.raises(UsageError, match=match):
        plan_settings(None, conf)


@given(st.integers(1, 150_109_880_320))
def test_fraction_gives_exactly_the_byte_limit(capacity: int) -> None:
    total = 150_109_880_320  # the H200's cudaMemGetInfo total
    f = fraction_for(capacity, total)
    assert int(f * total) == capacity and 0.0 < f <= 1.0


def test_recorded_limit_of_torch_oom_round_trips() -> None:
    assert int(fraction_for(15_038_676_992, 150_109_880_320) * 150_109_880_320) == 15_038_676_992


def _history(entries: list[tuple[str, int, int]]) -> tc.History:
    """PyTorch's entry dicts (an ``oom`` has no addr), read as a harvest reads them."""
    dicts = [{"action": a, "size": s, "stream": 0, "time_us": i, **({"addr": p} if a != "oom" else {})}
             for i, (a, p, s) in enumerate(entries)]
    h = history_of(dicts)
    read = tc.read_history(list(dicts), 0, tc.SiteTable(), StackBuilder())
    assert (h.action == read.action).all()  # the importer's codes
    return h


# input: 0 malloc 3 MiB, 1 segment_free (a recorded release), 2 malloc 1 KiB, 3 free #0, 4 malloc 64 GiB (OOM)
OPS = np.array([Op.MALLOC, Op.SEGMENT_FREE, Op.MALLOC, Op.FREE, Op.MALLOC], np.int64)
SIZES = np.array([3 * MiB, 20 * MiB, 1024, 3 * MiB, 64 << 30], np.int64)
MATES = np.array([3, -1, -1, 0, -1], np.int64)
STATUS = np.array([Status.DONE, Status.IGNORED, Status.DONE, Status.DONE, Status.OOM], np.int8)
ADDR = np.array([0xA000000, 0, 0xC000000, 0xA000000, 0], np.int64)
HISTORY = [
    ("segment_alloc", 0xA000000, 20 * MiB), ("alloc", 0xA000000, 3 * MiB),
    ("segment_alloc", 0xC000000, 2 * MiB), ("alloc", 0xC000000, 1024),
    ("free_requested", 0xA000000, 3 * MiB), ("free_completed", 0xA000000, 3 * MiB),
    ("segment_free", 0xA000000, 20 * MiB), ("oom", 0, 64 << 30),
]


def test_history_rows_go_before_the_request_that_made_them() -> None:
    req, actions = closing_requests(OPS, STATUS, SIZES, MATES, 0, len(OPS))
    assert req.tolist() == [0, 2, 3, 4]
    assert actions.tolist() == [tc.ALLOC, tc.ALLOC, tc.FREE_COMPLETED, tc.OOM]
    rows = attach(_history(HISTORY), req, actions, len(OPS), ADDR)
    assert rows.before.tolist() == [0, 2, 4]  # the OOM's release precedes the OOM
    assert rows.op.tolist() == [Op.SEGMENT_ALLOC, Op.SEGMENT_ALLOC, Op.SEGMENT_FREE]
    assert rows.size.tolist() == [20 * MiB, 2 * MiB, 20 * MiB]


def test_mappings_become_2mib_pages() -> None:
    ops, status = np.array([Op.MALLOC], np.int64), np.array([Status.DONE], np.int8)
    req, actions = closing_requests(ops, status, np.array([5 * MiB]), np.array([-1]), 0, 1)
    h = _history([("segment_map", 1 << 40, 20 * MiB), ("alloc", 1 << 40, 5 * MiB)])
    rows = attach(h, req, actions, 1, np.array([1 << 40], np.int64))
    assert rows.addr.tolist() == [(1 << 40) + k * 2 * MiB for k in range(10)]
    assert set(rows.size.tolist()) == {2 * MiB} and rows.mapped.all() and set(rows.before.tolist()) == {0}


def test_history_out_of_step_is_a_device_error() -> None:
    req, actions = closing_requests(OPS, STATUS, SIZES, MATES, 0, len(OPS))
    with pytest.raises(DeviceError, match="cannot be matched"):
        attach(_history(HISTORY[:-1]), req, actions, len(OPS), ADDR)
    moved = ADDR.copy()
    moved[2] += 512
    with pytest.raises(DeviceError, match="other addresses"):
        attach(_history(HISTORY), req, actions, len(OPS), moved)


def test_zero_byte_requests_leave_no_history() -> None:
    ops = np.array([Op.MALLOC, Op.FREE], np.int64)
    req, _ = closing_requests(ops, np.array([1, 1], np.int8), np.array([0, 0]), np.array([1, 0]), 0, 2)
    assert len(req) == 0


def test_starting_state_pieces() -> None:
    base = 1 << 30
    # large 20 MiB segment: 4 MiB block at 0, 0.5 MiB gap, 8 MiB block, 7.5 MiB free tail
    starts = np.array([base, base + 4 * MiB + MiB // 2])
    p = _pieces(base, 20 * MiB, starts, np.array([4 * MiB, 8 * MiB]), np.array([7, 9]), small=False)
    assert p == [(0, 4 * MiB + MiB // 2, 7), (4 * MiB + MiB // 2, 8 * MiB, 9),
                 (12 * MiB + MiB // 2, 7 * MiB + MiB // 2, -1)]
    # small 2 MiB segment, empty: two fillers of 1 MiB
    assert _pieces(base, 2 * MiB, starts[:0], starts[:0], starts[:0], small=True) == [
        (0, MiB, -1), (MiB, MiB, -1)]


def test_cli_refuses_torch_conf_for_other_allocators(tmp_path: Path) -> None:
    r = CliRunner().invoke(app, ["replay", str(ROOT / "traces" / "torch-train.parquet"), "--device", "0",
                                 "--allocator", "cupy", "--torch-conf", "expandable_segments:True"])
    assert r.exit_code == 2
    assert "--torch-conf settings apply to" in r.output


def test_cli_without_pytorch_says_so_in_one_sentence() -> None:
    try:
        import torch  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("PyTorch is installed here")
    trace = str(ROOT / "traces" / "torch-train.parquet")
    cmd = [sys.executable, "-m", "tracekit", "replay", trace, "--device", "0", "--allocator", "torch"]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 1
    assert r.stderr.startswith("tracekit: error: PyTorch is not importable") and "Traceback" not in r.stderr


def test_nothing_below_the_cli_imports_it() -> None:
    offenders: Counter[str] = Counter()
    for path in (ROOT / "tracekit").rglob("*.py"):
        if path.relative_to(ROOT / "tracekit").parts[0] in ("cli", "__main__.py"):  # the top and the entry
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            offenders.update(str(path.relative_to(ROOT)) for n in names if n.startswith("tracekit.cli"))
    assert not offenders, dict(offenders)


def test_without_free_entries_segment_rows_still_find_their_malloc() -> None:
    """PyTorch with ``skip_actions`` leaves frees out; a free never moves device memory here."""
    lean = [e for e in HISTORY if e[0] not in ("free_requested", "free_completed")]
    req, actions = closing_requests(OPS, STATUS, SIZES, MATES, 0, len(OPS), frees=False)
    assert req.tolist() == [0, 2, 4]
    rows = attach(_history(lean), req, actions, len(OPS), ADDR)
    assert rows.before.tolist() == [0, 2, 4]


@pytest.mark.parametrize(("name", "oversize_first", "with_limit", "without"), [
    ("torch-maxsplit.parquet", True, 1, 296),  # 295 retries under max_split_size_mb:64, one empty_cache()
    ("torch-oom.parquet", False, 3, 3),  # every recorded release was the allocator retrying under its limit
    ("torch-expandable.parquet", False, 1, 1),  # the program's own empty_cache() after step 8
    ("torch-handled-oom.parquet", False, 394, 394),  # 169 of them recorded retries
])
def test_retries_are_left_to_pytorch_only_where_it_releases_oversize_blocks_first(
        name: str, oversize_first: bool, with_limit: int, without: int) -> None:
    # Without max_split_size_mb a retry releases every cached block, as empty_cache() does, so
    # empty_cache() stands in for it even under a limit; with it, a limit leaves the retry to PyTorch.
    from tracekit.device.torch_replay import releases
    from tracekit.sim.prepare import prepare
    from tracekit.trace import read_trace

    trace = read_trace(ROOT / "traces" / name)
    init = prepare(trace).initial
    limit = trace.meta.pool_limit_bytes or 1
    assert int(releases(trace, init, limit, oversize_first).sum()) == with_limit
    assert int(releases(trace, init, None, oversize_first).sum()) == without


def test_handled_attempts_leave_the_history_the_loop_expects() -> None:
    """A 20 MiB handled attempt served and released at once (nothing replaced it) left ``alloc``
    then ``free_completed``; a served attempt standing in for its 2 MiB retry left ``alloc``, the
    retry (status TRIED: no call) nothing, and the retry's free the attempt's ``free_completed``;
    the segment the attempt took goes before it."""
    ops = np.array([Op.OOM, Op.MALLOC, Op.OOM, Op.MALLOC, Op.FREE], np.int64)
    status = np.array([Status.TRIED, Status.DONE, Status.DONE, Status.TRIED, Status.DONE], np.int8)
    sizes = np.array([20 * MiB, MiB, 8 * MiB, 2 * MiB, 2 * MiB])
    mates = np.array([-1, -1, -1, -1, 3])
    released = np.array([True, False, False, False, False])
    req, actions = closing_requests(ops, status, sizes, mates, 0, 5, True, released)
    assert req.tolist() == [0, 0, 1, 2, 4]
    assert actions.tolist() == [tc.ALLOC, tc.FREE_COMPLETED, tc.ALLOC, tc.ALLOC, tc.FREE_COMPLETED]
    h = _history([("segment_alloc", 1 << 40, 20 * MiB), ("alloc", 1 << 40, 20 * MiB),
                  ("free_completed", 1 << 40, 20 * MiB), ("alloc", 1 << 40, MiB),
                  ("alloc", (1 << 40) + MiB, 8 * MiB), ("free_completed", (1 << 40) + MiB, 8 * MiB)])
    addr = np.array([1 << 40, 1 << 40, (1 << 40) + MiB, (1 << 40) + MiB, 0], np.int64)
    rows = attach(h, req, actions, 5, addr)
    assert rows.before.tolist() == [0] and rows.op.tolist() == [Op.SEGMENT_ALLOC]
    req, actions = closing_requests(ops, status, sizes, mates, 0, 5, False, released)
    assert req.tolist() == [0, 1, 2] and actions.tolist() == [tc.ALLOC] * 3
