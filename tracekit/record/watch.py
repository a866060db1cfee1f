"""The watcher: a small process that finishes a recording however the recorded process ends.

``Watcher.start(spool, output)`` (before the program runs) starts ``python -m
tracekit.record.watch`` detached (its own session, reparented away from the program, so the
program never sees it as a child: ``os.wait()`` and Ctrl-C are the program's own). It holds:

- the read end of a pipe whose write end only the recorded process holds (close-on-exec, closed
  in forked children): end of file means that process has ended (``os._exit``, a signal,
  SIGKILL) or replaced itself (``exec``);
- ``pidfd_open`` of the recorded process, and its command line at the start, to tell a program
  that merely closed every descriptor (it is still running, with the same command line: the
  watcher then waits for it to end) from one that exec'd or died;
- an exclusive ``flock`` on ``TRACE.finishing`` (``tracekit.trace.finishing``) until it is done;
- a descriptor reading the spool and one reading its tail, opened at the start: a program that
  deletes or replaces them while it runs cannot take them (the watcher then writes the trace from
  the files it holds, ``spool_gone`` saying so).

The recorded process says one byte before it closes its end: ``D``, the trace is written (the
watcher just leaves), or ``F``, its own finishing failed (a program that broke the standard
library, the recursion limit): the watcher then writes the trace from the spool in its clean
process and answers on a second pipe (``D`` and the path the trace went to). Both pipe ends sit high
in the recorded process (``held_file.move_high``) and are checked to still be the pipes before use;
where the program closed them all the same (every descriptor), ``D`` goes as a line ``done PID``
into the mark, which the watcher reads once that process has ended. On end of file without
a byte, it writes the trace from the spool (``complete: false``, ``ended`` saying how), with the rows
made after the spool's last write taken from the shared ring beside it (``tracekit.record.tail``),
removes both and leaves. Where the program made its own file at the output, the trace goes to a
free name beside it (``tracekit.record.final``, as the recorded process does), and the watcher says
so in one sentence on the recording's standard error (a copy of descriptor 2 taken at the start:
the recorded process, which would say it, is gone).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import subprocess
import sys
from enum import StrEnum
from pathlib import Path

from tracekit.record.final import Keep
from tracekit.record.held_file import identity, move_high
from tracekit.trace.finishing import mark_path

DONE, FINISH = b"D", b"F"
DONE_NOTE = "done"  # the mark's line for DONE from a process whose pipe the program closed
FINISH_WAIT_S = 600.0
DONE_WAIT_S = 5.0
GONE = ("the program deleted or replaced the spool while it ran; the trace is written from the recorder's "
        "own copy")


class Watched(StrEnum):
    """What the watcher finishes: the CuPy recorder's spool (with its shared tail), or the ring of
    ``record --torch``'s tracker (``tracekit.record.torch_ring``). The value travels on the
    watcher's command line."""

    CUPY_SPOOL = "cupy"
    TORCH_RING = "torch"


class Watcher:
    """The recorded process's end of the watcher (pid of the process it watches: this one)."""

    def __init__(self, fd: int, answer: int, pid: int, mark: Path | None = None) -> None:
        self.fd, self.answer, self.pid = fd, answer, pid
        self.mark = mark  # the watcher's ``.finishing`` mark: where DONE goes when the pipe is gone
        # what the two pipe ends are: a program that closed them may have its own files under
        # those numbers since, and is never written to nor read from through them
        self._ends = identity(fd), identity(answer)

    def _ours(self) -> bool:
        return (identity(self.fd), identity(self.answer)) == self._ends and None not in self._ends

    @classmethod
    def start(cls, spool: Path, output: Path, keep: Keep | None = None,
              kind: Watched = Watched.CUPY_SPOOL) -> Watcher | None:
        """Start the watcher for ``spool`` → ``output`` (``keep``: the file there ``--force`` may
        replace; ``kind``: what ``spool`` is); None where it cannot be (no pidfd, no process): the
        recording goes on without it, as before."""
        if not hasattr(os, "pidfd_open"):
            return None
        r, w = os.pipe()  # both close-on-exec: only this process image holds ``w``
        ar, aw = os.pipe()
        err = -1
        with contextlib.suppress(OSError):
            err = os.dup(2)  # where the watcher says where the trace went, if not to ``output``
        try:
            p = subprocess.Popen(
                [sys.executable, "-m", "tracekit.record.watch", str(os.getpid()), str(r), str(aw),
                 os.fspath(spool), os.fspath(output), str(err), keep.text() if keep else "-", kind.value],
                pass_fds=(r, aw) if err < 0 else (r, aw, err), stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)
            ready = p.wait(timeout=30)  # the launcher forks the watcher off and leaves at once
        except Exception:
            ready = -1
        finally:
            for fd in (r, aw, err):
                if fd >= 0:
                    os.close(fd)
        if ready != 0:
            os.close(w)
            os.close(ar)
            return None
        # high numbers, as the spool's: a program that closes its low descriptors usually keeps them
        return cls(move_high(w), move_high(ar), os.getpid(), mark_path(output))

    def done(self) -> None:
        """The trace is written: the watcher removes its mark and leaves; waited for (a few ms), so no
        ``.finishing`` mark is left beside the trace once ``record`` returns."""
        if self._say(DONE, close=False):
            with contextlib.suppress(OSError, ValueError):
                _readable(self.answer, DONE_WAIT_S)
        elif os.getpid() == self.pid and self.mark is not None:
            # the program closed the pipe (every descriptor): say it in the mark instead, which the
            # watcher reads once this process has ended, before it would write a trace of its own
            with contextlib.suppress(OSError):
                fd = os.open(self.mark, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW)
                try:
                    os.write(fd, f"{DONE_NOTE} {self.pid}\n".encode())
                finally:
                    os.close(fd)
        self.close()

    def finish(self) -> Path | None:
        """This process could not write the trace: the watcher writes it; where it went (None where
        it could not). The answer is ``D`` and that path, then the end of the pipe (the watcher has
        left, its mark removed)."""
        if not self._say(FINISH, close=False):
            return None
        got = b""
        try:
            while True:
                ok = _readable(self.answer, FINISH_WAIT_S)
                chunk = os.read(self.answer, 1 << 16) if ok else b""
                if not chunk:
                    break
                got += chunk
        except OSError:
            pass
        finally:
            self.close()
        return Path(os.fsdecode(got[1:])) if got[:1] == DONE and len(got) > 1 else None

    def _say(self, what: bytes, close: bool = True) -> bool:
        if os.getpid() != self.pid or not self._ours():
            return False
        try:
            os.write(self.fd, what)
            return True
        except OSError:
            return False
        finally:
            if close:
                self.close()

    def close(self) -> None:
        """Close the ends that still are the pipes (a number the program took since is its own)."""
        for fd, ident in zip((self.fd, self.answer), self._ends, strict=True):
            if fd >= 0 and ident is not None and identity(fd) == ident:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.fd = self.answer = -1


def _readable(fd: int, timeout_s: float) -> bool:
    """Whether ``fd`` has something to read (or its end) within ``timeout_s``: ``poll``, since the
    recorded process's pipe ends sit above ``select``'s 1,024 (``held_file.move_high``)."""
    p = select.poll()
    p.register(fd, select.POLLIN)
    return bool(p.poll(timeout_s * 1000))


def _said_done(mark: int, pid: int) -> bool:
    """Whether the recorded process ``pid`` noted in the mark that its trace is written
    (``Watcher.done`` when its pipe was gone)."""
    try:
        text = os.pread(mark, 4096, 0).decode("ascii", "replace")
    except OSError:
        return False
    return f"{DONE_NOTE} {pid}" in text.splitlines()


def _cmdline(pid: int) -> bytes | None:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None


def _hold(path: Path) -> int:
    """A descriptor reading ``path`` (-1 where it cannot be opened)."""
    try:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return -1


def _read_head(fd: int) -> bytes | None:
    """The spool's magic and metadata frame as the recorder wrote them, read at the start so a program
    that writes over them cannot take them (``record.spool_format``: 8 bytes of magic, then the
    frame's 16-byte header, whose last 8 bytes are the payload's length, then the payload)."""
    try:
        first = os.pread(fd, 24, 0)
        n = int.from_bytes(first[16:24], "little")
        if len(first) < 24 or n > 1 << 26:
            return None
        head = first + os.pread(fd, n, 24)
    except (OSError, ValueError):
        return None
    return head if len(head) == 24 + n else None


def _source(path: Path, fd: int) -> Path | None:
    """``path`` where it still names the file ``fd`` reads (or no file was held), else that file
    through ``/proc/self/fd`` (the program deleted or replaced it); None where neither is there."""
    if fd < 0:
        return path if os.path.exists(path) else None
    with contextlib.suppress(OSError):
        if os.path.samestat(os.fstat(fd), os.stat(path)):
            return path
    return Path(f"/proc/self/fd/{fd}")


def _finish(spool: Path, output: Path, ended: str, held: tuple[int, int] = (-1, -1),
            head: bytes | None = None, keep: Keep | None = None) -> Path | None:
    """Write the trace from ``spool`` at ``output``, or beside it where the program made its own
    file there (``tracekit.record.final``; ``keep``: the file ``--force`` may replace), and remove
    the spool (``held``: descriptors reading it and its tail, opened at the start; ``head``: its
    first bytes as they were then); where it went, or None when there was nothing to do or it
    failed (the spool then stays for ``tracekit recover``)."""
    from tracekit.record.tail import tail_path

    source, tail = _source(spool, held[0]), _source(tail_path(spool), held[1])
    if source is None:
        return None
    from tracekit.kernel_cache import settle

    settle()
    from tracekit.record.final import write_final
    from tracekit.record.recover import finalize

    extra = {"complete": False, "ended": ended, "finished_by": "watcher"}
    if source != spool:
        extra["spool_gone"] = GONE
    try:
        final = write_final(output, lambda path, more: finalize(source, path, {**extra, **more}, tail=tail,
                                                                   head=head), keep)
    except Exception:
        return None
    if source == spool:  # a file the program put at the spool's name is its own
        spool.unlink(missing_ok=True)
    if tail == tail_path(spool):
        with contextlib.suppress(OSError):  # the dead process's last rows: in the trace now
            tail_path(spool).unlink(missing_ok=True)
    return final


def _finish_torch(ring: Path, output: Path, ended: str, held: tuple[int, int] = (-1, -1),
                  head: bytes | None = None, keep: Keep | None = None) -> Path | None:
    """Write the trace of a ``record --torch`` run from the tracker's ring (``held[0]``: a descriptor
    reading it, opened at the start) and remove the ring and its head; where it went, or None."""
    source = _source(ring, held[0])
    if source is None:
        return None
    from tracekit.kernel_cache import settle

    settle()
    from tracekit.record.torch_ring import head_path
    from tracekit.record.torch_trace import finish_from_ring

    extra = {"complete": False, "ended": ended, "finished_by": "watcher"}
    try:
        final = finish_from_ring(source, output, extra, keep)
    except Exception:
        return None
    if final is None:
        return None
    with contextlib.suppress(OSError):
        ring.unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        head_path(output).unlink(missing_ok=True)
    return final


FINISHERS = {Watched.CUPY_SPOOL: _finish, Watched.TORCH_RING: _finish_torch}


def _say_taken(err: int, output: Path, final: Path | None, start: str) -> None:
    """The sentence ``record`` would say, where the trace went beside a file the program made."""
    from tracekit.inputs import safe_text
    from tracekit.record.final import shown, taken_sentence

    if err < 0 or final is None or final == output:
        return
    text = safe_text(taken_sentence(shown(output, start), shown(final, start)), lines=True)
    with contextlib.suppress(OSError):
        os.write(err, (text + "\n").encode("utf-8", "backslashreplace"))


def watch(pid: int, fd: int, answer: int, spool: Path, output: Path, ready: int, err: int = -1,
          keep: Keep | None = None, kind: Watched = Watched.CUPY_SPOOL) -> None:
    """The watcher's whole life (module docstring); ``ready`` is told once the mark is held, ``err``
    is the recording's standard error."""
    from tracekit.record.tail import tail_path
    cwd = os.getcwd()  # the user's, as record's own lines name paths
    finish = FINISHERS[kind]
    spooled = kind is Watched.CUPY_SPOOL  # a spool with a tail and a head; a torch ring has neither
    held = _hold(spool), _hold(tail_path(spool)) if spooled else -1
    head = _read_head(held[0]) if held[0] >= 0 and spooled else None
    mark = os.open(mark_path(output), os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)  # read: _said_done
    fcntl.flock(mark, fcntl.LOCK_EX)
    os.write(mark, f"{pid}\n".encode())
    os.write(ready, b"R")
    os.close(ready)
    try:
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            return
        start = _cmdline(pid)
        said = b""
        with contextlib.suppress(OSError):
            select.select([fd], [], [])
            said = os.read(fd, 1)
        if said == DONE:
            with contextlib.suppress(OSError):
                os.unlink(mark_path(output))
            os.close(mark)
            mark = -1
            os.write(answer, DONE)  # after the mark is gone: the recorded process waits for this
            return
        if said == FINISH:  # the recorded process waits for the answer and says where the trace is
            final = finish(spool, output, "the recorder could not finish it", held, head, keep)
            os.write(answer, DONE + os.fsencode(final) if final is not None else b"X")
            return
        # End of file: it ended, exec'd, or only closed its descriptors (then it is the same program).
        ended = "the process ended (os._exit, a signal, or exec) without finishing the recording"
        now = _cmdline(pid)
        gone = bool(select.select([pidfd], [], [], 0)[0]) or not now  # a zombie's command line is empty
        if not gone and now == start:
            select.select([pidfd], [], [])  # still running: wait for its end
            ended = "the process ended (os._exit or a signal) without finishing the recording"
        elif not gone:
            ended = "the process replaced itself (exec) before finishing the recording"
        if _said_done(mark, pid):  # it wrote the trace after the program closed the pipe: nothing to do
            return
        _say_taken(err, output, finish(spool, output, ended, held, head, keep), cwd)
    finally:
        if mark >= 0:
            with contextlib.suppress(OSError):
                os.unlink(mark_path(output))
            os.close(mark)


def main(argv: list[str]) -> int:
    pid, fd, answer, spool, output = int(argv[0]), int(argv[1]), int(argv[2]), Path(argv[3]), Path(argv[4])
    err = int(argv[5]) if len(argv) > 5 else -1
    keep = Keep.parse(argv[6]) if len(argv) > 6 else None
    known = {w.value for w in Watched}
    kind = Watched(argv[7]) if len(argv) > 7 and argv[7] in known else Watched.CUPY_SPOOL
    r, w = os.pipe()
    if os.fork():  # the launcher leaves once the watcher holds its mark: no child of the program
        os.close(w)
        return 0 if os.read(r, 1) == b"R" else 1
    os.close(r)
    with contextlib.suppress(Exception):
        watch(pid, fd, answer, spool, output, w, err, keep, kind)
    return 0


if __name__ == "__main__":
    os._exit(main(sys.argv[1:]))
