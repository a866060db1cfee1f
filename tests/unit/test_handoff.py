"""``tracekit.handoff``: a trace handed to worker processes through one shared file, mapped, not read."""

from __future__ import annotations

import dataclasses
import fcntl
import os
import time
from pathlib import Path

import numpy as np
import pytest

from tracekit import handoff
from tracekit.errors import TracekitError
from tracekit.trace import read_trace
from tracekit.workers import Pool

ROOT = Path(__file__).resolve().parents[2]


def _same_events(a, b) -> None:  # type: ignore[no-untyped-def]
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray):
            assert x.dtype == y.dtype and np.array_equal(x, y), f.name
            assert x.flags.writeable == y.flags.writeable, f.name  # as read-only as the parent's


def test_a_trace_comes_back_whole_from_the_shared_file() -> None:
    trace = read_trace(ROOT / "traces" / "cupy-mlp.parquet")
    handle = handoff.share(trace)
    assert handle is not None and Path(handle.path).exists()
    try:
        back = handoff.attach(handle)
        _same_events(trace.events, back.events)
        assert back.meta == trace.meta and back.path == trace.path
        assert len(handle.payload) < 64 << 10  # the metadata travels; the columns are mapped
        assert handle.size >= sum(n for _, n in handle.spans)
    finally:
        handoff.release(handle)
    assert not Path(handle.path).exists()


def test_a_worker_writing_changes_only_its_own_pages() -> None:
    arrays = {"a": np.arange(1 << 20, dtype=np.int64)}  # writable, 8 MiB
    handle = handoff.share(arrays)
    assert handle is not None
    try:
        one, two = handoff.attach(handle), handoff.attach(handle)
        one["a"][:10] = -1
        assert int(two["a"][5]) == 5 and int(arrays["a"][5]) == 5
    finally:
        handoff.release(handle)


def test_small_objects_are_not_shared() -> None:
    assert handoff.share({"x": np.zeros(10)}) is None


def test_a_file_left_by_a_killed_process_is_swept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(handoff, "SHM", tmp_path)
    old = time.time() - 2 * handoff.STALE_S
    stale = tmp_path / f"{handoff.PREFIX}1-abc"  # nobody holds it, made long ago: a killed owner's
    stale.write_bytes(b"x")
    os.utime(stale, (old, old))
    held = tmp_path / f"{handoff.PREFIX}2-def"  # an owner (in another container, say) holds its lock
    held.write_bytes(b"x")
    os.utime(held, (old, old))
    fresh = tmp_path / f"{handoff.PREFIX}3-ghi"  # just made: its owner is about to lock it
    fresh.write_bytes(b"x")
    fd = os.open(held, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_SH)
    try:
        handle = handoff.share({"a": np.ones(1 << 18)})
        assert handle is not None and Path(handle.path).parent == tmp_path
        handoff._sweep(tmp_path)  # a second sweep meanwhile leaves the live handle's file alone
        assert Path(handle.path).exists()
        handoff.release(handle)
    finally:
        os.close(fd)
    assert not stale.exists() and held.exists() and fresh.exists()


def test_no_room_in_shared_memory_is_no_handoff(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(handoff, "SHM", tmp_path / "missing")  # nowhere to put it: the old way
    assert handoff.share({"a": np.ones(1 << 18)}) is None


def test_a_handle_whose_file_is_gone_is_one_sentence() -> None:
    handle = handoff.share({"a": np.ones(1 << 18)})
    assert handle is not None
    handoff.release(handle)
    with pytest.raises(TracekitError, match=r"the shared copy of the trace .* is gone"):
        handoff.attach(handle)


_MADE: list[int] = []


def _args() -> tuple[int]:
    _MADE.append(1)
    return (7,)


def _init(x: int) -> None:
    global _GOT
    _GOT = x


_GOT = 0


def _get(_: int) -> int:
    return _GOT


def test_a_pools_initargs_are_made_once_when_a_worker_starts() -> None:
    _MADE.clear()
    with Pool(1, initializer=_init, initargs=_args) as one:  # in this process: no worker starts
        assert list(one.map(_get, [0])) == [0]
    assert _MADE == []
    with Pool(2, initializer=_init, initargs=_args) as two:
        assert list(two.map(_get, [0, 1, 2])) == [7, 7, 7]
        assert list(two.map(_get, [3])) == [7]
    assert _MADE == [1]
