"""tracekit's one signal policy: signals held back by ``deferred()`` (raised when the block ends
or at its handle's ``check()``, forgotten when it raises), SIGTERM raised as asked, noted quietly.

Each test sends itself a real SIGTERM inside the block (the block's handler
only records it), so nothing reaches pytest's own handlers.
"""

from __future__ import annotations

import os
import signal

import pytest

from tracekit.errors import Interrupted
from tracekit.interrupts import deferred, quiet, restore_in_child, sigterm_raises


def test_a_held_signal_is_raised_when_the_block_ends() -> None:
    with pytest.raises(Interrupted) as caught, deferred():
        os.kill(os.getpid(), signal.SIGTERM)
    assert caught.value.exit_code == 143


def test_a_block_that_raises_forgets_its_held_signal() -> None:
    with pytest.raises(ValueError, match="the block's own error"), deferred():
        os.kill(os.getpid(), signal.SIGTERM)
        raise ValueError("the block's own error")
    with deferred():  # a later block in the same process raises no stale Interrupted
        pass


def test_the_handle_raises_a_held_sigint_at_check_exiting_130() -> None:
    with pytest.raises(Interrupted) as caught, deferred() as held:
        held.check()  # nothing held yet: no-op
        os.kill(os.getpid(), signal.SIGINT)
        held.check()
        raise AssertionError("check() raises the held signal")
    assert caught.value.exit_code == 130 and caught.value.signum == signal.SIGINT


class _Stop(BaseException):
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def test_sigterm_raises_what_the_caller_makes_and_the_handler_is_put_back() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(_Stop) as caught, sigterm_raises(_Stop):
        os.kill(os.getpid(), signal.SIGTERM)  # the handler runs as the call returns
    assert caught.value.signum == signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is before


def test_quiet_notes_signals_and_a_forked_child_gets_the_default_sigterm_back() -> None:
    with quiet() as got:
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGINT)
    assert got == [signal.SIGTERM, signal.SIGINT]
    before = signal.getsignal(signal.SIGTERM)
    try:
        with sigterm_raises(_Stop):
            restore_in_child()  # tracekit's handler: back to the default action
            assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    finally:
        signal.signal(signal.SIGTERM, before)
