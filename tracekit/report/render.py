"""Figures to PNG bytes, shared between two processes where the machine has two CPUs or more.

Drawing and encoding a figure is matplotlib's Agg, about 0.2 s per figure on the committed
traces whatever the layout engine, and after the imports the longest part of a report; no
figure depends on another. On Linux with two CPUs or more, once every figure's data is
computed, ``render`` forks one child, and both processes take the next figure to draw from a
shared queue (a pipe holding one 2-byte token per figure; a read that small is atomic, so each
figure goes to one process) until it is empty; the child sends its PNG bytes back through a
second pipe. Fork, not the worker pool (``tracekit.workers.Pool``, forkserver): the data is
already in memory, and a fresh interpreter would spend longer importing matplotlib than drawing.
The child only draws (matplotlib on NumPy arrays), writes no file and ends with ``os._exit``;
figures of a child that fails, is killed or sends nothing for ``CHILD_GRACE_S`` (it writes a byte
after each figure, so a slow child is waited for) are drawn here instead, so the bytes are the
same either way.

Why this fork is safe although Arrow's thread pools may exist (the hazard the pool's forkserver
avoids): a forked child has only the forking thread; a lock another thread held at the fork
stays held in the child forever, so the child hangs only if it takes such a lock. The child
takes none of Arrow's: it reads no file, builds no Arrow array and calls no Arrow function,
only matplotlib and NumPy on arrays computed before the fork (glibc's ``malloc`` locks are
reset across ``fork``). Should it hang anyway, the grace above ends it and this process draws
its figures, so the worst case is time, never a different page.
"""

from __future__ import annotations

import functools
import io
import os
import pickle
import select
import signal
import struct
import sys
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from matplotlib.figure import Figure
from matplotlib.text import Text
from matplotlib.ticker import FixedFormatter

from tracekit.inputs import plot_text
from tracekit.report import figures
from tracekit.report.html import Rendered
from tracekit.workers import usable_cpus

# The child's figures are drawn here if it has sent nothing (not even the byte it writes after
# each figure) for this long once this process finished its own: a hung child must not hang the
# report, a slow one is waited for.
CHILD_GRACE_S = 30.0


@dataclass(frozen=True)
class Pending:
    """A figure not drawn yet: its text and the function that draws it."""

    key: str
    title: str
    caption: str
    draw: Callable[[], Figure]


def png_bytes(fig: Figure) -> bytes:
    """``fig`` as PNG; zlib level 1 instead of 6: encoding 5-10 % faster, the file about 5 % larger.

    Every text the figure holds (titles, labels, legends, annotations: call-sites, file names,
    policy names a trace controls) is made literal first (``plot_text``): a ``$`` is drawn, never
    read as mathtext, and a control character is shown escaped instead of warned about. Tick
    labels given as text (call-sites, policies: a ``FixedFormatter``) are made literal too; the
    numeric ones are made by matplotlib's formatters while drawing and keep their math."""
    _make_literal(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=figures.DPI, pil_kwargs={"compress_level": 1})
    return buf.getvalue()


def _make_literal(fig: Figure) -> None:
    for text in fig.findobj(Text):
        if (s := text.get_text()) and (lit := plot_text(s)) != s:
            text.set_text(lit)
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            for fmt in (axis.get_major_formatter(), axis.get_minor_formatter()):
                if isinstance(fmt, FixedFormatter):
                    fmt.seq = [plot_text(s) for s in fmt.seq]
                # ``set_yticks(ticks, labels)`` keeps the labels in a dict behind a FuncFormatter
                # (matplotlib 3.8 and later); its values are the given text.
                func = getattr(fmt, "func", None)
                if isinstance(func, functools.partial) and func.args and isinstance(func.args[0], dict):
                    labels = func.args[0]
                    labels.update({k: plot_text(v) for k, v in labels.items() if isinstance(v, str)})


def _png(p: Pending) -> bytes:
    return png_bytes(p.draw())


def render(pending: Sequence[Pending]) -> list[Rendered]:
    """Every pending figure drawn, in order (shared with a forked child when that is possible)."""
    pngs: dict[int, bytes] = {}
    queue = _queue(len(pending)) if _can_split(len(pending)) else None
    child = _fork_for(pending, queue) if queue is not None else None
    delivered, read_end = False, None if child is None else child[1]
    try:
        if queue is not None:
            for i in _taken(queue):
                pngs[i] = _png(pending[i])
        if child is not None:
            read_end = None  # _collect closes it
            theirs = _collect(child[1], CHILD_GRACE_S)
            pngs.update(theirs)
            delivered = bool(theirs)
    finally:
        if read_end is not None:  # this process failed before reading the child's figures
            os.close(read_end)
        if child is not None:
            _reap(child[0], kill=not delivered)
        if queue is not None:
            os.close(queue)
    for i in range(len(pending)):  # anything the child took and did not deliver, or every figure
        if i not in pngs:
            pngs[i] = _png(pending[i])
    return [Rendered(p.key, p.title, p.caption, pngs[i]) for i, p in enumerate(pending)]


def _can_split(n: int) -> bool:
    # At most 1,000 figures: their tokens must fit in a pipe's buffer (64 KiB) at once. The main
    # thread only: the child resets signal handlers, which Python allows there alone.
    return (2 <= n <= 1000 and sys.platform == "linux" and usable_cpus() >= 2
            and threading.current_thread() is threading.main_thread())


def _queue(n: int) -> int:
    """The read end of a pipe holding the tokens 0 .. n-1 (2 bytes each), its write end closed."""
    r, w = os.pipe()
    os.write(w, b"".join(struct.pack("<H", i) for i in range(n)))  # n figures: far below a pipe's buffer
    os.close(w)
    return r


def _taken(queue: int) -> Iterator[int]:
    """The figures this process takes from the queue, until it is empty."""
    while len(token := os.read(queue, 2)) == 2:
        yield struct.unpack("<H", token)[0]


_SIGNALS = {signal.SIGINT, signal.SIGTERM}


def _fork_for(pending: Sequence[Pending], queue: int) -> tuple[int, int] | None:
    """Fork a child drawing what it takes from ``queue``; (pid, read end of its pipe), or None.

    The child writes one byte (``.``) per figure drawn, so a slow child is told from a hung one,
    then ``!`` and its PNGs pickled. Signals are held across the fork, so none runs one of this
    process's handlers in the child before it has its own.
    """
    r, w = os.pipe()
    held = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
    try:
        with warnings.catch_warnings():
            # Python 3.12+ warns when threads exist: here they are Arrow's pool, which the child
            # never touches (it draws NumPy data with matplotlib), and a hung child is ended.
            warnings.filterwarnings("ignore", "This process .* is multi-threaded", DeprecationWarning)
            pid = os.fork()
    except OSError:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
        os.close(r)
        os.close(w)
        return None
    if pid == 0:  # the child: draw, send, leave without running anything of the parent's
        code = 1
        try:
            for s in _SIGNALS:  # Ctrl-C or SIGTERM ends it; the parent handles its own
                signal.signal(s, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
            os.close(r)
            with os.fdopen(w, "wb", buffering=0) as f:
                drawn = {}
                for i in _taken(queue):
                    drawn[i] = _png(pending[i])
                    f.write(b".")
                f.write(b"!" + pickle.dumps(drawn))
            code = 0
        finally:
            os._exit(code)
    signal.pthread_sigmask(signal.SIG_SETMASK, held)
    os.close(w)
    return pid, r


def _collect(r: int, grace: float) -> dict[int, bytes]:
    """The child's PNGs read from ``r`` (then closed); nothing if it failed, or sent nothing for
    ``grace`` seconds."""
    chunks = []
    try:
        with os.fdopen(r, "rb", buffering=0) as f:
            poll = select.poll()  # not select(): that fails on descriptors above 1023
            poll.register(f, select.POLLIN)
            while True:
                if not poll.poll(grace * 1000):
                    return {}
                chunk = f.read(1 << 20)
                if not chunk:
                    break
                chunks.append(chunk)
        data = b"".join(chunks)
        mark = data.find(b"!")
        out = pickle.loads(data[mark + 1:]) if mark >= 0 else {}
    except Exception:  # a child that died while writing, or a pipe this process cannot wait on
        return {}
    return out if isinstance(out, dict) else {}


def _reap(pid: int, *, kill: bool) -> None:
    """Wait for the child (ended first when ``kill``) so no zombie is left."""
    try:
        if kill:
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ChildProcessError, ProcessLookupError):
        pass
