"""Where the members run: a pool of local worker processes, or Ray tasks on a cluster.

``open_engine`` gives a runner whose ``map(fn, args, on_error)`` runs
``fn(*a)`` for every ``a`` and yields ``(i, result)`` as tasks finish, with
at most ``WINDOW_PER_WORKER`` × workers tasks in flight, so the driver holds
a bounded number of pending results whatever the number of traces. A task
whose worker died (killed for memory, a crash in native code) yields
``on_error(i, exception)`` instead of stopping the others (locally, after
one retry alone: see ``LocalRunner``). One runner serves
every phase of a fleet run (rows, then the worst traces' figures), so
workers start once.

- ``local``: ``jobs`` long-lived processes (default: CPUs). Each imports the
  engine and loads numba's compiled kernels once, then takes trace after
  trace; process start-up and kernel loading, not the analysis, dominate
  small traces, so they are paid once, not once per trace. Started with
  forkserver (spawn where there is none): the driver holds Arrow's thread
  pools, which a forked child may find locked; the fork server preloads the
  analyzer (``tracekit.fleet.preload``), so the import and the kernel loading
  happen once for all workers. ``jobs=1`` runs in the driver itself.
- ``ray``: each trace is one Ray task (``num_cpus=1``) running the same
  function. ``address`` connects to a running cluster (``ray start --head``
  on one node, ``ray start --address`` on the others; every node needs
  tracekit installed and the traces at the same paths); without it a local
  Ray instance with ``jobs`` CPUs is started and stopped at the end. Ray's
  workers are long-lived too.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from enum import StrEnum
from typing import Any, TypeVar

from tracekit.errors import InputError, UsageError
from tracekit.workers import process_context, usable_cpus

T = TypeVar("T")
OnError = Callable[[int, Exception], Any]
WINDOW_PER_WORKER = 4
CONNECT_TIMEOUT_S = 5.0
_RAY_OBJECT_STORE = 128 << 20  # rows are small; a local instance needs no big shared-memory store


class Engine(StrEnum):
    LOCAL = "local"
    RAY = "ray"


def default_jobs() -> int:
    """One worker per CPU this process may use."""
    return usable_cpus()


class LocalRunner:
    """Tasks on a pool of ``jobs`` worker processes, created on first use (or in the driver for 1).

    A worker that dies breaks the whole pool: every task in it then fails with
    ``BrokenProcessPool``, and the pool does not say whose worker died. So the
    pool is rebuilt and each of those tasks runs once more, alone (nothing else
    in flight), before the next new task starts: a task that kills its worker
    again is then the one to blame and alone gets ``on_error``; the others,
    often killed only because they shared the machine's memory, finish.
    """

    def __init__(self, jobs: int) -> None:
        self.jobs = jobs
        self._pool: ProcessPoolExecutor | None = None
        self._generation = 0  # counts rebuilt pools, so one break rebuilds once

    def map(self, fn: Callable[..., T], args: Sequence[tuple[Any, ...]],
            on_error: OnError) -> Iterator[tuple[int, T]]:
        if self.jobs == 1:  # the sequential baseline, and no pool to start for tests
            for i, a in enumerate(args):
                yield i, fn(*a)
            return
        pending: dict[Future[T], tuple[int, bool, int]] = {}  # future -> (index, is a retry, generation)
        retry: deque[int] = deque()
        todo = iter(enumerate(args))
        while True:
            if retry:
                if not pending:  # the broken pool's tasks have all come back: retry one, alone
                    i = retry.popleft()
                    f, generation = self._submit(fn, args[i])
                    pending[f] = (i, True, generation)
            else:
                for i, a in todo:
                    f, generation = self._submit(fn, a)
                    pending[f] = (i, False, generation)
                    if len(pending) >= self.jobs * WINDOW_PER_WORKER:
                        break
            if not pending:
                return
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for f in done:
                i, retried, generation = pending.pop(f)
                try:
                    result = f.result()
                except BrokenProcessPool as e:
                    self._drop_pool(generation)
                    if not retried:
                        retry.append(i)
                        continue
                    result = on_error(i, e)  # it ran alone: its own worker died
                yield i, result

    def _submit(self, fn: Callable[..., T], a: tuple[Any, ...]) -> tuple[Future[T], int]:
        """The task's future and the generation of the pool it went to."""
        try:
            return self._get_pool().submit(fn, *a), self._generation
        except BrokenProcessPool:  # broke since the last result was read; the task has not run
            self._drop_pool(self._generation)
            return self._get_pool().submit(fn, *a), self._generation

    def _drop_pool(self, generation: int) -> None:
        """Shut the pool of ``generation`` down (once), so the next task starts a fresh one."""
        if generation == self._generation and self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
            self._generation += 1

    def _get_pool(self) -> ProcessPoolExecutor:
        if self._pool is None:
            # Workers fork from a server that already loaded the analyzer (tracekit.fleet.preload).
            ctx = process_context(["tracekit.fleet.preload"])
            self._pool = ProcessPoolExecutor(self.jobs, mp_context=ctx)
        return self._pool

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)


class RayRunner:
    """Tasks as Ray tasks of one CPU each on the connected (or started) Ray instance."""

    def __init__(self, ray: Any, jobs: int) -> None:
        self.ray = ray
        self.window = max(jobs, int(ray.cluster_resources().get("CPU", jobs))) * WINDOW_PER_WORKER

    def map(self, fn: Callable[..., T], args: Sequence[tuple[Any, ...]],
            on_error: OnError) -> Iterator[tuple[int, T]]:
        ray = self.ray
        task = ray.remote(num_cpus=1, max_retries=0)(fn)
        pending: dict[Any, int] = {}
        todo = iter(enumerate(args))
        while True:
            for i, a in todo:
                pending[task.remote(*a)] = i
                if len(pending) >= self.window:
                    break
            if not pending:
                return
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                i = pending.pop(ref)
                try:
                    result = ray.get(ref)
                except ray.exceptions.RayError as e:  # the task's worker or node died
                    result = on_error(i, e)
                yield i, result


@contextmanager
def open_engine(engine: Engine, jobs: int, address: str | None = None) -> Iterator[LocalRunner | RayRunner]:
    """A runner for ``engine``; stops what it started (the pool, a local Ray instance) on the way out."""
    if address is not None and engine is not Engine.RAY:
        raise UsageError("--address names a Ray cluster; use it with --engine ray")
    if engine is Engine.LOCAL:
        local = LocalRunner(jobs)
        try:
            yield local
        finally:
            local.close()
        return
    ray = _import_ray()
    if address is not None:
        _check_reachable(address)
    started = not ray.is_initialized()  # a session the caller opened is used as it is
    if started:
        _init_ray(ray, jobs, address)
    try:
        yield RayRunner(ray, jobs)
    finally:
        if started:
            ray.shutdown()


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise UsageError("--engine ray needs Ray; install it with: pip install 'tracekit[fleet]'") from None
    return ray


def _check_reachable(address: str) -> None:
    """InputError when ``HOST:PORT`` does not accept a connection (Ray itself retries for minutes)."""
    import socket

    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or "://" in address:
        return  # "auto", "ray://...": Ray resolves those itself
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as e:
        raise InputError(f"--address {address}: no Ray cluster answers there ({e.strerror or e})") from None


def _init_ray(ray: Any, jobs: int, address: str | None) -> None:
    import logging

    quiet = {"log_to_driver": False, "logging_level": logging.ERROR, "include_dashboard": False}
    try:
        if address is not None:
            ray.init(address=address, **quiet)  # the workers import tracekit from the nodes' installation
        else:
            ray.init(num_cpus=jobs, object_store_memory=_RAY_OBJECT_STORE, **quiet)
    except ConnectionError as e:
        raise InputError(f"--address {address}: cannot connect to a Ray cluster ({e})") from None
