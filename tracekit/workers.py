"""How many worker processes a parallel search starts when the user does not say (``--jobs``).

A worker is a fresh interpreter: it imports numpy, pyarrow and numba's compiled kernels
and reads the trace before its first task, about ``START_S`` seconds (0.7-1.0 s measured on
the 2-core development machine, 2026-12-01). One replay of an n-event trace takes about
n / ``EVENTS_PER_S`` seconds on one core (the CuPy and PyTorch models replay 18-19 M events/s,
the free lists somewhat fewer). Work whose serial estimate,
``serial_s = replays x events / EVENTS_PER_S``, is under ``2 x START_S`` runs in this process:
a pool would add more start-up than it saves (``whatif`` on a 20k-event trace: 1.3 s in
process, 2.0 s with two workers). Above that, one worker per CPU, at most one per task.

However many are asked for (``--jobs``), no more workers start than there are tasks, usable
CPUs (more only share them, each with its own memory: ``fleet --jobs 100`` on 2 CPUs took 7 GB
for nothing) and workers that fit the memory available (``cap_workers``); ``--jobs`` of any size,
``99999999999`` included, is a request, not an overflow.
"""

from __future__ import annotations

import multiprocessing
import os
import tempfile
from collections.abc import Sequence
from typing import Any

START_S = 1.0  # seconds to start one worker and read the trace
EVENTS_PER_S = 15e6  # events replayed per second on one core, rounded down
BISECT_REPLAYS = 12  # replays of one capacity bisection, typical (2 MiB steps)


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask under taskset or a container's cpuset)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def serial_seconds(events: int, replays: int) -> float:
    """Estimated seconds for ``replays`` replays of an ``events``-event trace on one core."""
    return replays * events / EVENTS_PER_S


def default_jobs(jobs: int | None, *, tasks: int, events: int, replays: int) -> int:
    """Processes for ``tasks`` tasks totalling ``replays`` replays of ``events`` events.

    ``jobs`` given: that many, at most one per task and one per usable CPU. Otherwise 1 (in this
    process) when ``serial_seconds(events, replays) < 2 * START_S``, else the CPU count, at most
    one per task.
    """
    cap = max(1, tasks)
    if jobs is not None:
        return max(1, min(jobs, cap, usable_cpus()))
    if serial_seconds(events, replays) < 2 * START_S:
        return 1
    return max(1, min(usable_cpus(), cap))


# The memory one verb (or one worker doing one verb's work) takes at most: 512 MiB plus 64 bytes
# per byte of its input files (docs/trace-format.md, "Input policy"; tests/test_memory_bound.py).
PEAK_FREE_BYTES = 512 << 20
PEAK_PER_INPUT_BYTE = 64


def peak_bytes(input_bytes: int) -> int:
    """The most memory a verb takes for ``input_bytes`` of input: PEAK_FREE_BYTES + 64 x input."""
    return PEAK_FREE_BYTES + PEAK_PER_INPUT_BYTE * max(0, input_bytes)


def available_memory() -> int | None:
    """Bytes this process may still take: the kernel's MemAvailable, lowered to what the cgroup
    (a container's memory limit) leaves, ``memory.max - memory.current``; None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            avail = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, ValueError, StopIteration, IndexError):
        return None
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        with open("/sys/fs/cgroup/memory.current") as f:
            used = int(f.read())
        if limit != "max":
            avail = min(avail, max(0, int(limit) - used))
    except (OSError, ValueError):
        pass  # no cgroup v2 limit here
    return avail


def cap_workers(jobs: int, *, tasks: int, worker_bytes: int) -> int:
    """Workers to start: ``min(jobs, tasks, usable CPUs, available memory // worker_bytes)``, at
    least 1 (one worker's work runs whatever the memory: it is the least that can be done)."""
    n = min(jobs, max(1, tasks), usable_cpus())
    avail = available_memory()
    if avail is not None and worker_bytes > 0:
        n = min(n, avail // worker_bytes)
    return max(1, n)


# The forkserver listens on a Unix socket at TMPDIR/pymp-XXXXXXXX/listener-XXXXXXXX (32 bytes
# after TMPDIR and its slash); a socket's name holds at most 107 bytes (sun_path, Linux).
_SOCKET_NAME_BYTES = 32
_SUN_PATH_BYTES = 107


def process_context(preload: Sequence[str] = ()) -> Any:
    """The start method of worker processes: forkserver (not fork: the parent holds Arrow's thread
    pools, which a forked child may find locked), with ``preload`` imported once by the server;
    spawn where there is no forkserver or where ``TMPDIR`` is too long for its socket's name."""
    fits = len(os.fsencode(tempfile.gettempdir())) + _SOCKET_NAME_BYTES <= _SUN_PATH_BYTES
    if fits and "forkserver" in multiprocessing.get_all_start_methods():
        ctx: Any = multiprocessing.get_context("forkserver")
        if preload:
            ctx.set_forkserver_preload(list(preload))  # takes effect where the server is not running yet
        return ctx
    return multiprocessing.get_context("spawn")
