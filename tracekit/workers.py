"""How many threads or worker processes a command runs its work on, and the one pool that runs it.

``advise`` and ``whatif`` replay on threads of their own process (``Pool.map``): every
replay kernel lets the GIL go, so a thread costs no start and shares the input this process
prepared once. One replay of an n-event trace takes about n / ``EVENTS_PER_S`` seconds on one
core (the CuPy and PyTorch models replay 18-19 M events/s, the free lists somewhat fewer);
``default_threads`` keeps work whose serial estimate, ``serial_s = replays x events /
EVENTS_PER_S``, is under ``THREADS_FROM_S`` in the calling thread (the Python around each replay
would be most of it), and gives the rest one thread per CPU, at most one per task. (Worker
processes cost 2.1 s to start 15 on the 16-core host, and each set the trace up again before its
first replay; docs/performance.md.) ``fleet`` runs whole traces on worker processes.

However many are asked for (``--jobs``), no more workers start than there are tasks, usable
CPUs (more only share them, each with its own memory: ``fleet --jobs 100`` on 2 CPUs took 7 GB
for nothing) and workers that fit the memory available (``cap_workers``); ``--jobs`` of any size,
``99999999999`` included, is a request, not an overflow.

``Pool`` is the one way tracekit runs work on several threads (``map``: ``advise``, ``whatif``) or
processes (``each``: ``fleet``): in the calling thread for one job, else ``jobs`` threads, or
``jobs`` workers started by ``process_context`` (forkserver; never fork, which the report's figure
child alone uses, see ``tracekit.report.render``). A worker process that dies breaks the whole
pool: ``each`` rebuilds it and retries the tasks that shared it, each alone, so only the task that
kills its worker again fails.
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import tempfile
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from tracekit import interrupts, numpy_setup, progress

if TYPE_CHECKING:  # concurrent.futures is imported where a pool starts: most verbs never start one
    from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor

T = TypeVar("T")
R = TypeVar("R")
OnError = Callable[[int, Exception], Any]

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


THREADS_FROM_S = 0.25  # serial seconds of replays from which advise and whatif take a thread per CPU


def default_threads(jobs: int | None, *, tasks: int, events: int, replays: int) -> int:
    """Threads for ``tasks`` tasks totalling ``replays`` replays of ``events`` events (every one
    whole, the most the work can be). ``jobs`` given: that many, at most one per task and one per
    usable CPU. Otherwise 1 (this thread) when ``serial_seconds(events, replays)`` is under
    ``THREADS_FROM_S`` (the Python around each replay would be most of the work), else one per
    usable CPU, at most one per task."""
    cap = max(1, min(tasks, usable_cpus()))
    if jobs is not None:
        return max(1, min(jobs, cap))
    return 1 if serial_seconds(events, replays) < THREADS_FROM_S else cap


# The memory one verb (or one worker doing one verb's work) takes at most: 512 MiB plus 64 bytes
# per byte of its input files (docs/trace-format.md, "Input policy"; tests/cli/test_memory_bound.py).
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


def process_context() -> Any:
    """The start method of worker processes: forkserver (not fork: the parent holds Arrow's thread
    pools, which a forked child may find locked); spawn where there is no forkserver or where
    ``TMPDIR`` is too long for its socket's name. The fork server's preload (process-wide) is
    never changed: a pool that wants modules loaded names them to ``Pool`` (``imports``)."""
    fits = len(os.fsencode(tempfile.gettempdir())) + _SOCKET_NAME_BYTES <= _SUN_PATH_BYTES
    if fits and "forkserver" in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("forkserver")
    return multiprocessing.get_context("spawn")


WINDOW_PER_WORKER = 4  # tasks in flight per worker in ``Pool.each``: bounded pending results


def _stoppable(stop: threading.Event, fn: Callable[[T], R], task: T) -> R:
    """``fn(task)`` in a pool's thread, told to stop (``interrupts.Cancelled``) once ``stop`` is set."""
    interrupts.stop_when(stop)
    interrupts.check()  # queued behind a task that ran while the pool was closed
    return fn(task)


def _start(imports: Sequence[str]) -> None:
    """A worker process's start: NumPy loaded as the verbs load it (``tracekit.numpy_setup``: a
    worker's tasks multiply no matrix), then ``imports`` (warming what they load)."""
    numpy_setup.load_numpy()
    for name in imports:
        importlib.import_module(name)


class Pool:
    """``jobs`` workers, started on first use; none when ``jobs`` is 1 (tasks run in the calling
    thread). ``map`` runs its tasks on ``jobs`` threads of this process: for tasks whose time is in
    compiled code that lets the GIL go (the replay kernels, ``nogil``): no start, no copy of the
    input, whatever this process has prepared shared by every task. ``each`` runs them on ``jobs``
    worker processes (``process_context``), each importing ``imports`` first: for whole tasks
    that read their own input and may die (``fleet``)."""

    def __init__(self, jobs: int, *, imports: Sequence[str] = ()) -> None:
        self.jobs = max(1, jobs)
        self._imports = tuple(imports)
        self._threads: ThreadPoolExecutor | None = None
        self._stop = threading.Event()  # set by ``close``: the threads' tasks end at their next check
        self._pool: ProcessPoolExecutor | None = None
        self._generation = 0  # counts rebuilt pools, so one break rebuilds once

    def parallel(self, tasks: int) -> bool:
        """Whether a ``map`` of ``tasks`` tasks runs them side by side, not one after another."""
        return self.jobs > 1 and tasks >= 2

    def map(self, fn: Callable[[T], R], tasks: Sequence[T]) -> Iterator[R]:
        """``fn(t)`` for every task, in order, on the pool's threads; each finished task is reported
        to ``progress`` (in the calling thread a task's own reports fill its part of the bar; in a
        pool's thread they go nowhere: no receiver there)."""
        if self.jobs == 1:
            for i, t in enumerate(tasks):
                with progress.part(i, len(tasks)):
                    yield fn(t)
            return
        for done, r in enumerate(self._thread_pool().map(partial(_stoppable, self._stop, fn), tasks), 1):
            progress.report(done, len(tasks))
            yield r

    def start(self, fn: Callable[[T], R], task: T) -> Future[R]:
        """``fn(task)`` begun on one of the pool's threads and not waited for (``jobs`` > 1): the
        caller takes its answer from the future when it needs it, or never (``close`` stops it
        at its next check, as it stops ``map``'s)."""
        assert self.jobs > 1, "a pool of one thread runs its tasks in the caller's"
        return self._thread_pool().submit(_stoppable, self._stop, fn, task)

    def each(self, fn: Callable[..., R], args: Sequence[tuple[Any, ...]],
             on_error: OnError) -> Iterator[tuple[int, R]]:
        """``(i, fn(*args[i]))`` as tasks finish, at most ``WINDOW_PER_WORKER`` x jobs in flight.

        A worker that dies breaks the pool: every task in it then fails with
        ``BrokenProcessPool``, and the pool does not say whose worker died. So the pool is
        rebuilt and each of those tasks runs once more, alone (nothing else in flight), before
        the next new task starts: a task that kills its worker again is then the one to blame
        and alone gets ``on_error(i, exception)``; the others, often killed only because they
        shared the machine's memory, finish.
        """
        if self.jobs == 1:  # the sequential baseline, and no pool to start for tests
            for i, a in enumerate(args):
                yield i, fn(*a)
            return
        from concurrent.futures import FIRST_COMPLETED, wait
        from concurrent.futures.process import BrokenProcessPool

        pending: dict[Future[R], tuple[int, bool, int]] = {}  # future -> (index, is a retry, generation)
        retry: deque[int] = deque()
        todo = iter(enumerate(args))
        while True:
            self._fill(fn, args, todo, retry, pending)
            if not pending:
                return
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for f in done:
                i, retried, generation = pending.pop(f)
                try:
                    result = f.result()
                except BrokenProcessPool as e:
                    self._drop(generation)
                    if not retried:
                        retry.append(i)
                        continue
                    result = on_error(i, e)  # it ran alone: its own worker died
                yield i, result

    def _fill(self, fn: Callable[..., R], args: Sequence[tuple[Any, ...]],
              todo: Iterator[tuple[int, tuple[Any, ...]]], retry: deque[int],
              pending: dict[Future[R], tuple[int, bool, int]]) -> None:
        """Submit the next retry once nothing is in flight, else new tasks up to the window."""
        if retry:
            if not pending:  # the broken pool's tasks have all come back: retry one, alone
                i = retry.popleft()
                pending[self._submit(fn, args[i])] = (i, True, self._generation)
            return
        for i, a in todo:
            pending[self._submit(fn, a)] = (i, False, self._generation)
            if len(pending) >= self.jobs * WINDOW_PER_WORKER:
                return

    def _submit(self, fn: Callable[..., R], a: tuple[Any, ...]) -> Future[R]:
        """The task's future, on the current generation's pool."""
        from concurrent.futures.process import BrokenProcessPool

        try:
            return self._executor().submit(fn, *a)
        except BrokenProcessPool:  # broke since the last result was read; the task has not run
            self._drop(self._generation)
            return self._executor().submit(fn, *a)

    def _drop(self, generation: int) -> None:
        """Shut the pool of ``generation`` down (once), so the next task starts a fresh one."""
        if generation == self._generation and self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
            self._generation += 1

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            from concurrent.futures import ProcessPoolExecutor

            self._pool = ProcessPoolExecutor(self.jobs, mp_context=process_context(), initializer=_start,
                                             initargs=(self._imports,))
        return self._pool

    def _thread_pool(self) -> ThreadPoolExecutor:
        if self._threads is None:
            from concurrent.futures import ThreadPoolExecutor

            self._stop = threading.Event()
            self._threads = ThreadPoolExecutor(self.jobs, thread_name_prefix="tracekit-task")
        return self._threads

    def close(self) -> None:
        """Stop the workers: tasks not started are dropped; a thread's running task ends at its
        next ``interrupts.check()`` (at the latest when its current replay ends: a compiled kernel
        cannot be stopped from outside), raising ``interrupts.Cancelled`` there."""
        if self._threads is not None:
            self._stop.set()
            self._threads.shutdown(wait=False, cancel_futures=True)
            self._threads = None
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
