"""Figures drawn in two processes: the same bytes as in one, and a failing or hung child costs
nothing but time (tracekit.report.render)."""

from __future__ import annotations

import os
import time
from functools import partial

import pytest
from matplotlib.figure import Figure

from tracekit.report import render as rd
from tracekit.report.render import Pending, render

pytestmark = pytest.mark.skipif(not rd._can_split(2), reason="splitting needs Linux and two CPUs")
PARENT = os.getpid()


def _line(k: int) -> Figure:
    fig = Figure(figsize=(3, 2))
    fig.add_subplot().plot([0, 1, 2], [0, k, k * k])
    return fig


def _fails_in_child(k: int) -> Figure:
    if os.getpid() != PARENT:
        raise RuntimeError("only in the child")
    return _line(k)


def _hangs_in_child(k: int) -> Figure:
    if os.getpid() != PARENT:
        time.sleep(60)
    return _line(k)


def _pending(draw) -> list[Pending]:
    return [Pending(f"f{k}", f"figure {k}", "", partial(draw, k)) for k in range(5)]


def _forks(monkeypatch) -> list[int]:
    """The pids of the children ``render`` forks, as it forks them."""
    pids: list[int] = []
    real = rd._fork_for

    def spy(pending, queue):
        child = real(pending, queue)
        if child is not None:
            pids.append(child[0])
        return child

    monkeypatch.setattr(rd, "_fork_for", spy)
    return pids


def _reaped(pid: int) -> bool:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return False


def _serial(pending: list[Pending]) -> list[bytes]:
    return [rd.png_bytes(p.draw()) for p in pending]


def test_two_processes_give_the_same_bytes_in_the_same_order(monkeypatch) -> None:
    pending = _pending(_line)
    pids = _forks(monkeypatch)
    out = render(pending)
    assert len(pids) == 1 and _reaped(pids[0])
    assert [r.key for r in out] == [p.key for p in pending]
    assert [r.png for r in out] == _serial(pending)


def test_figures_of_a_failing_child_are_drawn_here() -> None:
    out = render(_pending(_fails_in_child))
    assert [r.png for r in out] == _serial(_pending(_line))


def test_a_hung_child_is_ended_and_its_figures_drawn_here(monkeypatch) -> None:
    monkeypatch.setattr(rd, "CHILD_GRACE_S", 0.5)
    pids = _forks(monkeypatch)
    t = time.monotonic()
    out = render(_pending(_hangs_in_child))
    assert time.monotonic() - t < 30
    assert [r.png for r in out] == _serial(_pending(_line))
    assert len(pids) == 1 and _reaped(pids[0])


def test_an_error_here_ends_the_child_and_is_raised(monkeypatch) -> None:
    def boom(k: int) -> Figure:
        # Whichever figures this process takes from the queue fail; the child, slower to start,
        # leaves it at least one.
        if os.getpid() == PARENT:
            raise ValueError("drawing failed")
        time.sleep(0.2)
        return _line(k)

    pids = _forks(monkeypatch)
    with pytest.raises(ValueError, match="drawing failed"):
        render(_pending(boom))
    assert len(pids) == 1 and _reaped(pids[0])


def test_a_slow_child_that_keeps_drawing_is_waited_for(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(rd, "CHILD_GRACE_S", 0.5)
    drawn_here: list[int] = []
    started = tmp_path / "child-started"

    def slow(k: int) -> Figure:
        if os.getpid() == PARENT:
            drawn_here.append(k)
            # This process's first figure waits until the child has taken one: on a loaded
            # machine the child can start after this process emptied the queue by itself.
            deadline = time.monotonic() + (30 if len(drawn_here) == 1 else 0)
            while not started.exists() and time.monotonic() < deadline:
                time.sleep(0.01)
        else:
            started.touch()
        time.sleep(0.3)  # each figure well within the grace, all of them together not
        return _line(k)

    out = render(_pending(slow))
    assert [r.png for r in out] == _serial(_pending(_line))
    assert len(drawn_here) < 5  # the child's figures were taken from it, not drawn again


def test_many_open_descriptors_do_not_stop_the_split(tmp_path) -> None:
    # select() cannot wait on a descriptor above 1023; the pipe to the child gets one here.
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1200:
        pytest.skip(f"the open-file limit is {soft}")
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        out = render(_pending(_line))
    finally:
        for fd in held:
            os.close(fd)
    assert [r.png for r in out] == _serial(_pending(_line))
