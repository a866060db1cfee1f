"""Round trips on real PyTorch 2.11 snapshots recorded on an H200 (traces/torch-*.pickle.gz).

The importer's trace must end in exactly the state the snapshot records, and a
history cut short the way PyTorch's ring buffer cuts it must start from exactly
the state the full history had at the cut (worked out here with a plain dict
model of the raw entries, independent of the importer).
"""

from __future__ import annotations

import gzip
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tracekit.importers.torch_snapshot import convert, import_snapshot
from tracekit.trace import Op, read_trace

TRACES = Path(__file__).resolve().parents[2] / "traces"
NAMES = ("train", "oom", "expandable", "tuned", "wrap", "record-oom")


def snapshot(name: str) -> Any:
    with gzip.open(TRACES / f"torch-{name}.pickle.gz") as f:
        return pickle.load(f)


def end_state(tr: Any) -> tuple[dict[int, int], dict[int, int]]:
    """Live blocks {addr: requested} and segments {addr: bytes} after every row (contiguous cells merged)."""
    blocks: dict[int, int] = {}
    segs: dict[int, int] = {}
    ev = tr.events
    for o, a, s in zip(ev.op.tolist(), ev.addr.tolist(), ev.size.tolist(), strict=True):
        if o == Op.MALLOC:
            blocks[a] = s
        elif o == Op.FREE:
            del blocks[a]
        elif o == Op.SEGMENT_ALLOC:
            segs[a] = s
        elif o == Op.SEGMENT_FREE:
            assert segs.pop(a) == s
    return blocks, segs


def merge(segs: dict[int, int]) -> dict[int, int]:
    out: list[list[int]] = []
    for a in sorted(segs):
        if out and out[-1][0] + out[-1][1] == a:
            out[-1][1] += segs[a]
        else:
            out.append([a, segs[a]])
    return {a: s for a, s in out}


@pytest.mark.parametrize("name", NAMES)
def test_import_ends_in_the_snapshot_state(name: str, tmp_path: Path) -> None:
    r = import_snapshot(TRACES / f"torch-{name}.pickle.gz", tmp_path / "t.parquet")
    tr = read_trace(r.path, strict=True)
    assert not tr.issues and tr.meta.source == "torch"
    snap = snapshot(name)
    live = {b["address"]: b["requested_size"] for g in snap["segments"] for b in g["blocks"]
            if b["state"] != "inactive"}
    blocks, segs = end_state(tr)
    assert blocks == live
    final = {g["address"]: g["total_size"] for g in snap["segments"]}
    assert (merge(segs) if name == "expandable" else segs) == final
    acts = [e["action"] for e in snap["device_traces"][0]]
    n_rows = sum(acts.count(a) for a in ("alloc", "free_completed", "segment_alloc", "segment_free", "oom"))
    init = tr.extras.column("initial").to_numpy(zero_copy_only=False)
    if name != "expandable":
        assert len(tr.events) - int(init.sum()) == n_rows
    assert np.all(np.diff(tr.events.t_ns) >= 0)


def test_oom_snapshot_keeps_the_failed_request_and_the_limit(tmp_path: Path) -> None:
    tr = read_trace(import_snapshot(TRACES / "torch-oom.pickle.gz", tmp_path / "o.parquet").path)
    oom = np.flatnonzero(tr.events.op == Op.OOM)
    assert len(oom) == 1
    i = int(oom[0])
    assert tr.events.size[i] == tr.events.rounded[i] == 2_097_152_000
    assert tr.extras.column("device_free")[i].as_py() == 136_158_773_248
    obs = tr.meta.extra["torch_oom_observer"]
    assert tr.meta.pool_limit_bytes == obs["total_or_allowed"] == 15_038_676_992
    assert tr.meta.device is not None and tr.meta.device.name == "NVIDIA H200"


def test_wrapped_snapshot_starts_from_its_segments(tmp_path: Path) -> None:
    tr = read_trace(import_snapshot(TRACES / "torch-wrap.pickle.gz", tmp_path / "w.parquet").path)
    init = tr.extras.column("initial").to_numpy(zero_copy_only=False)
    first = int(np.argmin(init))
    assert init[:first].all() and not init[first:].any()
    assert np.all(tr.events.t_ns[:first] == 0)
    seg_rows = int(np.count_nonzero(tr.events.op[:first] == Op.SEGMENT_ALLOC))
    assert seg_rows == len(snapshot("wrap")["segments"]) - 1  # one segment_alloc is in the history
    assert tr.meta.extra["torch_max_entries"] == 1500


def oracle(entries: list[dict[str, Any]]) -> tuple[dict[int, int], dict[int, int], set[int]]:
    """Blocks {addr: requested}, plain segments {addr: bytes} and mapped MiB pages after ``entries``."""
    blocks: dict[int, int] = {}
    segs: dict[int, int] = {}
    pages: set[int] = set()
    for e in entries:
        a = e["action"]
        if a == "alloc":
            blocks[e["addr"]] = e["size"]
        elif a == "free_completed":
            blocks.pop(e["addr"])
        elif a == "segment_alloc":
            segs[e["addr"]] = e["size"]
        elif a == "segment_free":
            segs.pop(e["addr"])
        elif a in ("segment_map", "segment_unmap"):
            rng = set(range(e["addr"] >> 20, (e["addr"] + e["size"]) >> 20))
            pages = pages | rng if a == "segment_map" else pages - rng
    return blocks, segs, pages


@pytest.mark.parametrize("name", ["train", "oom", "expandable"])
@pytest.mark.parametrize("cut", [0.1, 0.5, 0.93])
def test_ring_buffer_cut_starts_from_the_true_state(name: str, cut: float, tmp_path: Path) -> None:
    snap = snapshot(name)
    hist = snap["device_traces"][0]
    k = int(len(hist) * cut)
    blocks, segs, pages = oracle(hist[:k])
    snap["device_traces"][0] = hist[k:]  # what a ring buffer of len(hist) - k entries keeps
    c = convert(snap, tmp_path / "cut.pickle")
    ev, extras = c.events, c.extras
    init = extras["initial"].to_numpy(zero_copy_only=False)
    n = int(init.sum())
    op, addr, size = ev.op[:n], ev.addr[:n].tolist(), ev.size[:n].tolist()
    m, s = op == Op.MALLOC, op == Op.SEGMENT_ALLOC
    got_blocks = dict(zip(np.array(addr)[m].tolist(), np.array(size)[m].tolist(), strict=True))
    assert got_blocks == blocks
    expand = extras["expandable"].to_numpy(zero_copy_only=False)[:n]
    plain = s & ~expand
    assert dict(zip(np.array(addr)[plain].tolist(), np.array(size)[plain].tolist(), strict=True)) == segs
    got_pages = {p for a, z in zip(np.array(addr)[s & expand].tolist(), np.array(size)[s & expand].tolist(),
                                   strict=True) for p in range(a >> 20, (a + z) >> 20)}
    assert got_pages == pages


def _relative() -> Any:
    """scripts/relativize_sites.py's rule: committed call-sites name no folder of the recording machine."""
    import importlib.util

    script = TRACES.parent / "scripts" / "relativize_sites.py"
    spec = importlib.util.spec_from_file_location("relativize_sites", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.relative


@pytest.mark.parametrize("name", NAMES)
def test_committed_traces_match_a_fresh_import(name: str, tmp_path: Path) -> None:
    fresh = import_snapshot(TRACES / f"torch-{name}.pickle.gz", tmp_path / "f.parquet").path
    a, b = pq.read_table(TRACES / f"torch-{name}.parquet"), pq.read_table(fresh)
    assert a.column_names == b.column_names
    relative = _relative()
    for col in a.column_names:
        x, y = a.column(col), b.column(col)
        if col == "site":  # the snapshot keeps the recording machine's paths; the trace does not
            assert x.to_pylist() == [relative(s) for s in y.to_pylist()], col
        elif pa.types.is_dictionary(x.type):  # compare the values, not the dictionary's order
            assert x.to_pylist() == y.to_pylist(), col
        else:
            assert x.equals(y), col


@pytest.mark.parametrize("name", NAMES)
def test_round_size_matches_real_blocks(name: str) -> None:
    # Small-pool blocks are always split to the rounded size; a large-pool block keeps an unsplit
    # remainder of at most 1 MiB (kSmallSize), so it is round_size(request) plus 0 to 1 MiB.
    from tracekit.sim.torch_rules import divisions_from_settings, round_size

    snap = snapshot(name)
    blocks = [(b["size"], b["requested_size"], g["segment_type"], g.get("is_expandable", False))
              for g in snap["segments"] for b in g["blocks"] if b["state"] != "inactive"]
    size, req = (np.array([b[i] for b in blocks], np.uint64) for i in (0, 1))
    small = np.array([b[2] == "small" for b in blocks])
    r = round_size(req, divisions_from_settings(snap.get("allocator_settings")))
    assert np.array_equal(r[small], size[small])
    # With max_split_size M, a request >= M takes a whole cached block smaller than request + 20 MiB.
    m = int((snap.get("allocator_settings") or {}).get("max_split_size", -1))
    oversize = (req >= m) if 0 < m < 1 << 62 else np.zeros(len(req), bool)
    limit = np.where(oversize, 20 << 20, 1 << 20)[~small]
    slack = size[~small].astype(np.int64) - r[~small].astype(np.int64)
    assert np.all((slack >= 0) & (slack <= limit))


def test_record_torch_output_carries_the_observed_limit(tmp_path: Path) -> None:
    # Recorded on the GPU by `tracekit record --torch` under a 256 MiB memory fraction.
    tr = read_trace(import_snapshot(TRACES / "torch-record-oom.pickle.gz", tmp_path / "r.parquet").path)
    assert tr.meta.pool_limit_bytes == 256 << 20
    assert tr.meta.extra["torch_import"]["skipped_actions"] == {"snapshot": 1}
    oom = int(np.flatnonzero(tr.events.op == Op.OOM)[0])
    assert tr.events.size[oom] == 64 << 20 and tr.events.site_name(oom).endswith(":make")
