"""The compiled snapshot scanner gives exactly the restricted unpickler's trace, and survives any bytes."""

from __future__ import annotations

import gzip
import json
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tracekit.importers import pickle_scan as ps
from tracekit.importers.torch_snapshot import import_snapshot, scan_file

TRACES = Path(__file__).resolve().parents[2] / "traces"
DATA = Path(__file__).resolve().parents[1] / "data"
A = 0x7F00_0000_0000
F1 = {"filename": "/venv/lib/python3.12/site-packages/torch/nn/functional.py", "line": 10, "name": "linear"}
F2 = {"filename": "/home/u/train.py", "line": 2**64 - 1, "name": "<module>"}


def same_trace(snapshot: Path, tmp: Path) -> None:
    fast = import_snapshot(snapshot, tmp / "fast.parquet", fast=True)
    slow = import_snapshot(snapshot, tmp / "slow.parquet", fast=False)
    a, b = pq.read_table(fast.path), pq.read_table(slow.path)
    assert a.column_names == b.column_names
    for c in a.column_names:
        assert a.column(c).to_pylist() == b.column(c).to_pylist(), c
    ma, mb = (json.loads(pq.read_schema(p).metadata[b"tracekit"]) for p in (fast.path, slow.path))
    ma.pop("created_utc"), mb.pop("created_utc")
    assert ma == mb


@pytest.mark.parametrize("name", ["train", "oom", "expandable", "tuned", "wrap", "record-oom"])
def test_real_snapshots_scan_to_the_same_trace(name: str, tmp_path: Path) -> None:
    snap = scan_file(TRACES / f"torch-{name}.pickle.gz")
    assert snap is not None and isinstance(snap["device_traces"][0], ps.EntryList)  # no fallback
    same_trace(TRACES / f"torch-{name}.pickle.gz", tmp_path)


def hand_built(with_bytes: bool = True) -> dict[str, Any]:
    def e(action: Any, addr: int, size: int, t: Any, frames: Any = None, **kw: Any) -> dict[str, Any]:
        return {"action": action, "addr": addr, "size": size, "stream": 7, "time_us": t,
                "frames": frames if frames is not None else [], **kw}

    d0 = [e("segment_alloc", A, 2 << 20, 5, [F1, F2]), e("alloc", A, 100, 6, [F1]),
          e("annotate", 0, 0, 7), e("free_requested", A, 100, 8), e("free_completed", A, 100, 9, [F2]),
          {"action": "oom", "size": 1 << 30, "stream": 0, "time_us": 10, "device_free": 12345}]
    d1 = [e("alloc", A, 3 << 20, 4, [F2, F1]), e("segment_map", A + (64 << 20), 20 << 20, 11)]
    seg = {"device": 1, "address": A, "total_size": 20 << 20, "stream": 7, "segment_type": "large",
           "segment_pool_id": (0, 0), "is_expandable": False, "frames": [F1, F2],
           "blocks": [{"address": A, "size": 3 << 20, "requested_size": 3 << 20, "state": "active_allocated",
                       "frames": [F2]}]}
    return {"segments": [seg], "device_traces": [d0, d1],
            "allocator_settings": {"max_split_size": 2**64 - 1, "garbage_collection_threshold": 0.5,
                                   "roundup_power2_divisions": {"1": 4}, "expandable_segments": False},
            "tracekit": {"memory_fraction": 0.25, "allowed_bytes": 1 << 33, "workload": "x" * 300},
            "external_annotations": [{"stage": "START", "name": "step", "bytes": b"\x00\x01" if with_bytes
                                      else None}]}


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
@pytest.mark.parametrize("gz", [False, True])
def test_hand_built_snapshot_every_protocol(protocol: int, gz: bool, tmp_path: Path) -> None:
    data = pickle.dumps(hand_built(with_bytes=protocol >= 3), protocol=protocol)  # 2 pickles bytes by a call
    p = tmp_path / "s.pickle"
    p.write_bytes(gzip.compress(data) if gz else data)
    assert scan_file(p) is not None
    same_trace(p, tmp_path)


def test_entries_without_time_and_with_odd_fields(tmp_path: Path) -> None:
    snap = {"segments": [], "device_traces": [[
        {"action": "segment_alloc", "addr": A, "size": 1 << 21, "stream": None},
        {"action": "alloc", "addr": A, "size": True, "frames": None, "time_us": None},
        {"size": 5},  # no action at all: skipped as "None"
    ]]}
    p = tmp_path / "s.pickle"
    p.write_bytes(pickle.dumps(snap, protocol=4))
    same_trace(p, tmp_path)


@pytest.mark.parametrize("name", sorted(f.name for f in DATA.glob("torch_*.pickle*")))
def test_bad_files_fall_back_to_the_unpickler(name: str) -> None:
    assert scan_file(DATA / name) is None


def test_protocol_0_falls_back(tmp_path: Path) -> None:
    p = tmp_path / "s.pickle"
    p.write_bytes(pickle.dumps({"segments": [], "device_traces": []}, protocol=0))
    assert scan_file(p) is None


VALID = pickle.dumps(hand_built(), protocol=4)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, len(VALID)), st.lists(st.tuples(st.integers(0, len(VALID) - 1), st.integers(0, 255)),
                                            max_size=8))
def test_any_bytes_never_crash_the_scanner(cut: int, flips: list[tuple[int, int]]) -> None:
    data = bytearray(VALID[:cut])
    for i, v in flips:
        if i < len(data):
            data[i] = v
    buf = np.frombuffer(bytes(data), dtype=np.uint8)
    out = ps.scan(buf)  # returns a snapshot or None; must never read out of bounds
    assert out is None or isinstance(out, dict | list | tuple | int | float | str | bytes | bool)
