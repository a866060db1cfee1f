"""The spool's held descriptor: one open for the whole recording, high, never writing into a file
that took its number after the program closed it."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from tracekit.record.held_file import HeldFile, high_floor


def lowest_free() -> int:
    fd = os.open(os.devnull, os.O_RDONLY)
    os.close(fd)
    return fd


def test_one_descriptor_serves_every_write_and_sits_high(tmp_path: Path) -> None:
    before = lowest_free()
    f = HeldFile(tmp_path / "s")
    f.open(os.O_CREAT | os.O_EXCL)
    fd = f.fd
    assert fd is not None and fd >= high_floor()
    assert fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC
    assert lowest_free() == before  # the program's next descriptor is the one it would get anyway
    for i in range(5):
        f.write(b"%d" % i)
    assert f.fd == fd  # no open or close between writes
    f.close()
    assert (tmp_path / "s").read_bytes() == b"01234"


def test_a_closed_descriptor_is_opened_again(tmp_path: Path) -> None:
    f = HeldFile(tmp_path / "s")
    f.open(os.O_CREAT)
    f.write(b"a")
    assert f.fd is not None
    os.close(f.fd)  # what os.closerange(3, ...) in the program does
    f.write(b"b")
    f.close()
    assert (tmp_path / "s").read_bytes() == b"ab"


def test_a_number_reused_by_the_program_is_left_alone(tmp_path: Path) -> None:
    f = HeldFile(tmp_path / "s")
    f.open(os.O_CREAT)
    f.write(b"a")
    fd = f.fd
    assert fd is not None
    os.close(fd)
    theirs = os.open(tmp_path / "theirs", os.O_WRONLY | os.O_CREAT, 0o644)
    os.dup2(theirs, fd)  # the program's file now has the spool's old number
    f.write(b"b")
    f.close()
    os.write(fd, b"mine")  # still open: the recorder did not close the program's descriptor
    os.close(fd)
    os.close(theirs)
    assert (tmp_path / "s").read_bytes() == b"ab"
    assert (tmp_path / "theirs").read_bytes() == b"mine"
