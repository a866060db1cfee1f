"""The calling thread's hardware counters (instructions and cycles retired in user space), read
through Linux's ``perf_event_open``: a measure of work that does not move with the clock speed
of a shared host, beside wall and CPU seconds. Where the kernel or the hypervisor does not give
the counters (``perf_event_paranoid``, no virtual PMU), ``ThreadCounters.open()`` returns None.

    counters = ThreadCounters.open(); before = counters.read(); ...; after = counters.read()
"""

from __future__ import annotations

import ctypes
import os
import struct

SYS_PERF_EVENT_OPEN = {"x86_64": 298, "aarch64": 241}.get(os.uname().machine)
PERF_TYPE_HARDWARE = 0
CPU_CYCLES, INSTRUCTIONS = 0, 1
EXCLUDE_KERNEL, EXCLUDE_HV = 1 << 5, 1 << 6
ATTR_SIZE = 64  # PERF_ATTR_SIZE_VER0: every kernel takes it


def _open(config: int) -> int:
    """A counter of the calling thread, on any CPU, user space only; -1 where none is given."""
    if SYS_PERF_EVENT_OPEN is None:
        return -1
    # type, size, config, sample_period, sample_type, read_format, flags; the rest zero
    attr = struct.pack("IIQQQQQ", PERF_TYPE_HARDWARE, ATTR_SIZE, config, 0, 0, 0, EXCLUDE_KERNEL | EXCLUDE_HV)
    buf = ctypes.create_string_buffer(attr.ljust(ATTR_SIZE, b"\0"), ATTR_SIZE)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return int(libc.syscall(ctypes.c_long(SYS_PERF_EVENT_OPEN), buf, ctypes.c_int(0), ctypes.c_int(-1),
                            ctypes.c_int(-1), ctypes.c_ulong(0)))


class ThreadCounters:
    """Instructions and cycles of the thread that opened them."""

    def __init__(self, fds: tuple[int, int]) -> None:
        self.fds = fds

    @classmethod
    def open(cls) -> ThreadCounters | None:
        fds = (_open(INSTRUCTIONS), _open(CPU_CYCLES))
        if min(fds) < 0:
            for fd in fds:
                if fd >= 0:
                    os.close(fd)
            return None
        return cls(fds)

    def read(self) -> tuple[int, int]:
        """(instructions, cycles) so far."""
        ins, cyc = (struct.unpack("q", os.read(fd, 8))[0] for fd in self.fds)
        return ins, cyc
