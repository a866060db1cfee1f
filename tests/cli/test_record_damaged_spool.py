"""A spool the program damaged gives the events that are intact (the CuPy stand-in, whole processes).

The spools here are a real recording's: a tiny program copies its own spool and tail in the middle
of its run (after one spool write, with three mallocs made since), and the tests damage copies of
them: cut short in the middle of a frame, written over with garbage or zeros in the middle, the
tail written over. ``tracekit recover`` keeps the whole frames before the damage, takes the rows
after it from the tail where the tail holds them, and says in one sentence each on the terminal (and
in the trace's metadata) at which byte and frame it stopped and why. A program that deletes its
spool or its tail while it runs, or writes over its spool, still leaves its whole trace: the
recorder and the watcher finish from the files they hold.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tracekit.record.fastpath import COMPILED, HEADER_BYTES
from tracekit.record.hook import ROW
from tracekit.record.spool_format import FRAME, MAGIC, ROWS
from tracekit.trace import Op, read_trace

ROOT = Path(__file__).resolve().parents[2]
FAKE = Path(__file__).resolve().parents[1] / "fakecupy"
ALL = 23  # the program's mallocs: 20 before its spool's first write, 3 after (only in the tail)

needs_ring = pytest.mark.skipif(not COMPILED, reason="the tail (the shared ring of the last rows) needs "
                                "the compiled helper, tracekit.record._fastpath")

PROGRAM = """
    import glob, os, shutil, signal, sys, time
    import cupy
    keep = [cupy.empty(1 << 20) for _ in range(20)]
    time.sleep(0.8)  # past the flush interval: these rows are in the spool
    more = [cupy.empty(1 << 20) for _ in range(3)]  # in the program's memory and the tail only
"""


def _tk(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{FAKE}"}
    return subprocess.run([sys.executable, "-m", "tracekit", *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=120)


def _record(tmp: Path, program: str) -> subprocess.CompletedProcess[str]:
    (tmp / "app.py").write_text(textwrap.dedent(program))
    return _tk(tmp, "record", "-o", "t.parquet", "app.py")


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, bytes | None]:
    """(the spool, its tail) as a recording had them in the middle of its run."""
    tmp = tmp_path_factory.mktemp("recorded")
    p = _record(tmp, PROGRAM + """
    for f in glob.glob("t.parquet.spool*"):
        shutil.copy(f, "copy-" + f)
    """)
    assert p.returncode == 0, p.stderr
    tail = tmp / "copy-t.parquet.spool.tail"
    return (tmp / "copy-t.parquet.spool").read_bytes(), tail.read_bytes() if tail.exists() else None


def _frames(spool: bytes) -> list[tuple[int, bytes, int]]:
    """(byte offset, tag, payload length) of every frame."""
    out, at = [], len(MAGIC)
    while at < len(spool):
        tag, _, length = FRAME.unpack_from(spool, at)
        out.append((at, tag, length))
        at += FRAME.size + length
    return out


def _recover(tmp: Path, spool: bytes, tail: bytes | None = None) -> subprocess.CompletedProcess[str]:
    (tmp / "d.parquet.spool").write_bytes(spool)
    if tail is not None:
        (tmp / "d.parquet.spool.tail").write_bytes(tail)
    return _tk(tmp, "recover", "d.parquet.spool")


def _mallocs(path: Path) -> int:
    return int((read_trace(path, strict=True).events.op == Op.MALLOC).sum())


def _last_rows(spool: bytes) -> int:
    return [at for at, tag, _ in _frames(spool) if tag == ROWS][-1]


def test_the_spool_itself_holds_the_first_writes_and_the_tail_the_rest(tmp_path: Path, recorded) -> None:
    spool, tail = recorded
    p = _recover(tmp_path, spool)
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    assert 20 <= _mallocs(tmp_path / "d.parquet") < ALL  # those made after the last write: not in it
    if tail is not None:
        (tmp_path / "d.parquet").unlink()
        p = _recover(tmp_path, spool, tail)
        assert p.returncode == 0 and _mallocs(tmp_path / "d.parquet") == ALL, p.stderr


@pytest.mark.parametrize("into", [FRAME.size - 7, FRAME.size + 100], ids=["in-a-header", "in-the-rows"])
def test_a_spool_cut_short_in_the_middle_of_a_frame_keeps_the_frames_before_and_says_where(
        tmp_path: Path, recorded, into: int) -> None:
    spool, tail = recorded
    at = _last_rows(spool)
    whole = _recover(tmp_path, spool[:at])  # the same prefix, cut at the frame's start
    before = _mallocs(tmp_path / "d.parquet")
    (tmp_path / "d.parquet").unlink()
    p = _recover(tmp_path, spool[:at + into])
    assert whole.returncode == 0 and p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    t = read_trace(tmp_path / "d.parquet", strict=True)
    assert int((t.events.op == Op.MALLOC).sum()) == before
    frame = next(i for i, (a, _, _) in enumerate(_frames(spool)) if a == at)
    assert t.meta.extra["spool_truncated"] is True
    assert t.meta.extra["spool_cut"].startswith(f"at byte {at:,} (frame {frame}, ")
    notes = [ln for ln in p.stderr.splitlines() if ln.startswith("tracekit:")]
    assert len(notes) == 1 and f"cut short at byte {at:,} (frame {frame}" in notes[0], p.stderr
    if tail is not None:  # the rows of the cut frame and after come back from the tail
        (tmp_path / "d.parquet").unlink()
        p = _recover(tmp_path, spool[:at + into], tail)
        assert p.returncode == 0 and _mallocs(tmp_path / "d.parquet") == ALL
        assert "came back from its tail" in p.stderr


@pytest.mark.parametrize("junk, says", [
    (b"\xde\xad" * 8, "a frame of unknown kind"),
    (b"\0" * 16, "a frame of unknown kind"),
    (None, "an event stamped before the recording began"),  # the rows' payload zeroed, the header kept
    (b"rows", "a spool row has op code"),  # garbage over the rows, the header kept
], ids=["garbage-header", "zeros-header", "zeros-rows", "garbage-rows"])
def test_a_spool_written_over_in_the_middle_keeps_its_prefix_and_the_tail_the_rest(
        tmp_path: Path, recorded, junk: bytes | None, says: str) -> None:
    spool, tail = recorded
    at = _last_rows(spool)
    _, _, length = FRAME.unpack_from(spool, at)
    if junk is None:
        damaged = spool[:at + FRAME.size] + b"\0" * length + spool[at + FRAME.size + length:]
    elif junk == b"rows":
        rows = bytearray(spool[at + FRAME.size:at + FRAME.size + length])
        rows[8:16] = (9).to_bytes(8, "little")  # the first row's op code: none of the recorder's
        damaged = spool[:at + FRAME.size] + bytes(rows) + spool[at + FRAME.size + length:]
    else:
        damaged = spool[:at] + junk + spool[at + len(junk):]
    assert len(damaged) == len(spool)
    _recover(tmp_path, spool[:at])
    before = _mallocs(tmp_path / "d.parquet")
    (tmp_path / "d.parquet").unlink()
    p = _recover(tmp_path, damaged)
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    t = read_trace(tmp_path / "d.parquet", strict=True)
    assert int((t.events.op == Op.MALLOC).sum()) == before  # the whole frames before, nothing after
    damage = t.meta.extra["spool_damaged"]
    assert says in damage and damage.startswith(f"at byte {at:,} (frame ")
    notes = [ln for ln in p.stderr.splitlines() if ln.startswith("tracekit:")]
    assert len(notes) == 1 and "stops making sense" in notes[0] and says in notes[0], p.stderr
    if tail is not None:
        (tmp_path / "d.parquet").unlink()
        p = _recover(tmp_path, damaged, tail)
        assert p.returncode == 0 and _mallocs(tmp_path / "d.parquet") == ALL, p.stderr


def test_a_spool_written_over_before_its_first_event_is_refused_in_one_sentence(tmp_path: Path, recorded
                                                                               ) -> None:
    spool, _ = recorded
    at = next(a for a, tag, _ in _frames(spool) if tag == ROWS)
    p = _recover(tmp_path, spool[:at] + b"\xff" * 64 + spool[at + 64:])
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
    assert p.stderr.startswith("tracekit: error: ") and len(p.stderr.strip().splitlines()) == 1
    assert "no event in it is intact" in p.stderr and f"at byte {at:,}" in p.stderr
    assert not (tmp_path / "d.parquet").exists()


@needs_ring
def test_a_tail_written_over_gives_its_rows_before_the_damage(tmp_path: Path, recorded) -> None:
    spool, tail = recorded
    assert tail is not None
    _recover(tmp_path, spool)
    alone = _mallocs(tmp_path / "d.parquet")
    (tmp_path / "d.parquet").unlink()
    p = _recover(tmp_path, spool, os.urandom(len(tail)))  # not a ring at all: the spool's rows alone
    assert p.returncode == 0 and "Traceback" not in p.stderr and _mallocs(tmp_path / "d.parquet") == alone
    (tmp_path / "d.parquet").unlink()
    p = _recover(tmp_path, spool, tail[:100])  # a ring cut short
    assert p.returncode == 0 and "Traceback" not in p.stderr and _mallocs(tmp_path / "d.parquet") == alone
    # One slot written over, its marker kept (the seqlock cannot tell): the rows before it are kept.
    (tmp_path / "d.parquet").unlink()
    slots = (len(tail) - HEADER_BYTES) // (8 * (ROW + 1))
    rows_in_spool = sum(n for _, tag, n in ((a, t, ln // (8 * ROW)) for a, t, ln in _frames(spool))
                        if tag == ROWS)
    bad = bytearray(tail)
    slot = HEADER_BYTES + 8 * (ROW + 1) * ((rows_in_spool + 2) % slots)
    bad[slot + 8:slot + 16] = (9).to_bytes(8, "little")  # the third tail row's op code
    p = _recover(tmp_path, spool, bytes(bad))
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    t = read_trace(tmp_path / "d.parquet", strict=True)
    assert t.meta.extra["tail_rows"] == 2 and "after 2 of its" in t.meta.extra["tail_damaged"]
    assert "tail stops making sense after 2 of its" in p.stderr


ENDS = {"exit": ("", 0), "os._exit": ("os._exit(3)", 3), "SIGKILL": ("os.kill(os.getpid(), signal.SIGKILL)",
                                                                       -signal.SIGKILL)}


@pytest.mark.parametrize("end", list(ENDS))
@pytest.mark.parametrize("what", ["spool", "spool and tail"])
def test_a_program_that_deletes_its_spool_while_recording_still_leaves_its_whole_trace(
        tmp_path: Path, end: str, what: str) -> None:
    code, status = ENDS[end]
    gone = "os.unlink('t.parquet.spool')" + ("; os.unlink('t.parquet.spool.tail')" if "tail" in what
                                             and COMPILED else "")
    p = _record(tmp_path, PROGRAM + f"    {gone}\n    {code}\n")
    assert p.returncode == status and "Traceback" not in p.stderr, p.stderr
    t = read_trace(tmp_path / "t.parquet", strict=True)  # waits for the watcher where it writes it
    # The recorder's own descriptor (or the watcher's) still reads the deleted files: every malloc.
    mallocs = int((t.events.op == Op.MALLOC).sum())
    assert mallocs == ALL if COMPILED or end == "exit" else mallocs >= 20  # without a tail: the spool's
    assert "deleted or replaced the spool" in t.meta.extra["spool_gone"]
    assert sorted(x.name for x in tmp_path.iterdir()) == ["app.py", "t.parquet"]
    if end == "exit":
        assert "deleted or replaced the spool" in p.stderr and t.meta.extra["complete"] is True


@needs_ring
def test_a_program_that_writes_over_its_spool_gets_the_rest_from_the_tail(tmp_path: Path) -> None:
    p = _record(tmp_path, PROGRAM + """
    size = os.path.getsize("t.parquet.spool")
    with open("t.parquet.spool", "r+b") as f:  # garbage over the last 100 bytes it wrote
        f.seek(size - 100)
        f.write(b"\\xee" * 100)
    """)
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    t = read_trace(tmp_path / "t.parquet", strict=True)
    assert int((t.events.op == Op.MALLOC).sum()) == ALL  # the rows after the damage: from the tail
    assert "stops making sense" in p.stderr and "came back from its tail" in p.stderr
    assert "spool_damaged" in t.meta.extra and t.meta.extra["tail_rows"] > 0
    assert sorted(x.name for x in tmp_path.iterdir()) == ["app.py", "t.parquet"]


@needs_ring
@pytest.mark.parametrize("end", ["exit", "SIGKILL"])
@pytest.mark.parametrize("damage", ["os.truncate('t.parquet.spool', 100)",
                                    "open('t.parquet.spool', 'r+b').write(os.urandom(4000))"],
                         ids=["truncated-into-its-metadata", "garbage-over-its-metadata"])
def test_a_spool_whose_metadata_the_program_destroyed_is_finished_from_the_recorder_s_copy(
        tmp_path: Path, end: str, damage: str) -> None:
    """The recorder (and the watcher, from the start) hold the spool's first bytes as they wrote them:
    the trace is written with them and the rows from the tail, no spool left for ``recover``."""
    code, status = ENDS[end]
    p = _record(tmp_path, PROGRAM.replace("more = ", f"{damage}\n    more = ") + f"    {code}\n")
    assert p.returncode == status and "Traceback" not in p.stderr, p.stderr
    t = read_trace(tmp_path / "t.parquet", strict=True)
    assert int((t.events.op == Op.MALLOC).sum()) == ALL
    assert "recorder's own copy" in t.meta.extra["spool_head_restored"]
    assert sorted(x.name for x in tmp_path.iterdir()) == ["app.py", "t.parquet"]
    if end == "exit":
        assert "recorder's own copy" in p.stderr

