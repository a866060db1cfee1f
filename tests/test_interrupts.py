"""Signals held back by ``deferred()``: raised when the block ends, forgotten when it raises.

Each test sends itself a real SIGTERM inside the block (the block's handler
only records it), so nothing reaches pytest's own handlers.
"""

from __future__ import annotations

import os
import signal

import pytest

from tracekit.errors import Interrupted
from tracekit.interrupts import deferred


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
