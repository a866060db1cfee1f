"""Where the members run: a pool of local worker processes, or Ray tasks on a cluster.

``open_engine`` gives a runner whose ``map(fn, args, on_error)`` runs
``fn(*a)`` for every ``a`` and yields ``(i, result)`` as tasks finish, with
at most ``WINDOW_PER_WORKER`` × workers tasks in flight, so the driver holds
a bounded number of pending results whatever the number of traces. A task
whose worker died (killed for memory, a crash in native code) yields
``on_error(i, exception)`` instead of stopping the others (locally, after
one retry alone: see ``tracekit.workers.Pool.each``). One runner serves
every phase of a fleet run (rows, then the worst traces' figures), so
workers start once.

- ``local``: ``jobs`` long-lived processes (default: CPUs). Each imports the
  engine and loads numba's compiled kernels once, then takes trace after
  trace; process start-up and kernel loading, not the analysis, dominate
  small traces, so they are paid once, not once per trace. The one worker
  pool (``tracekit.workers.Pool``: forkserver, spawn where there is none);
  each worker imports ``tracekit.fleet.preload`` as it starts, so the
  analyzer's kernels are loaded before its first trace (the process-wide
  fork-server preload other pools share is left as it is). ``jobs=1`` runs
  in the driver itself.
- ``ray``: each trace is one Ray task (``num_cpus=1``) running the same
  function. ``address`` connects to a running cluster (``ray start --head``
  on one node, ``ray start --address`` on the others; every node needs
  tracekit installed and the traces at the same paths); without it a local
  Ray instance with ``jobs`` CPUs is started and stopped at the end. Ray's
  workers are long-lived too.
"""

from __future__ import annotations

import importlib.util
import ipaddress
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeVar

from tracekit.errors import InputError, TracekitError, UsageError
from tracekit.inputs import os_cause, safe_text
from tracekit.workers import WINDOW_PER_WORKER, Pool, usable_cpus

T = TypeVar("T")
OnError = Callable[[int, Exception], Any]
CONNECT_TIMEOUT_S = 5.0
_RAY_OBJECT_STORE = 128 << 20  # rows are small; a local instance needs no big shared-memory store


class Engine(StrEnum):
    LOCAL = "local"
    RAY = "ray"


def default_jobs() -> int:
    """One worker per CPU this process may use."""
    return usable_cpus()


class LocalRunner:
    """Tasks on ``tracekit.workers.Pool`` (``jobs`` processes, or the driver itself for 1): a
    worker that dies fails its own task only (``Pool.each``: the broken pool is rebuilt and the
    tasks that shared it run again, each alone). Every worker imports ``tracekit.fleet.preload``
    when it starts, so the analyzer's kernels are loaded before its first trace."""

    def __init__(self, jobs: int) -> None:
        self.jobs = jobs
        self._pool = Pool(jobs, imports=["tracekit.fleet.preload"])

    def map(self, fn: Callable[..., T], args: Sequence[tuple[Any, ...]],
            on_error: OnError) -> Iterator[tuple[int, T]]:
        return self._pool.each(fn, args, on_error)

    def close(self) -> None:
        self._pool.close()


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
    where = parse_address(address) if address is not None else None  # a typo costs nothing
    ray = _import_ray()
    if where is not None:
        _check_client(where, address or "")
        _check_reachable(where, address or "")
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
        raise UsageError('--engine ray needs Ray; install it with: pip install -e ".[ray]"') from None
    return ray


@dataclass(frozen=True)
class Address:
    """A Ray cluster's address: ``HOST:PORT`` (the head's GCS) or ``ray://HOST:PORT`` (Ray's client)."""

    client: bool
    host: str
    port: int


MAX_HOST = 253  # characters of a DNS name (RFC 1035), dots included
_LABEL = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")  # one dot-separated part, 1..63


def parse_address(address: str) -> Address | None:
    """``--address`` checked: None for ``auto`` (Ray finds the cluster started on this machine),
    else the host and port; UsageError naming what is wrong (a port outside 1..65535, a host name
    longer than 253 characters or with a part that is not letters, digits, ``-`` and ``_``, a
    scheme other than ``ray://``), before Ray is imported or anything is contacted."""
    shown = safe_text(address if len(address) <= 80 else address[:77] + "...")
    if address == "auto":
        return None
    scheme, sep, rest = address.partition("://")
    if sep and scheme != "ray":
        raise UsageError(f"--address {shown}: give HOST:PORT, ray://HOST:PORT or auto")
    host, colon, port = (rest if sep else address).rpartition(":")
    if not colon or not host:
        raise UsageError(f"--address {shown}: give HOST:PORT, ray://HOST:PORT or auto")
    if not (port.isascii() and port.isdigit() and len(port) <= 5 and 1 <= int(port) <= 65535):
        raise UsageError(f"--address {shown}: the port must be a number from 1 to 65535")
    _check_host(host, shown)
    return Address(bool(sep), host[1:-1] if host.startswith("[") else host, int(port))


def _check_host(host: str, shown: str) -> None:
    if host.startswith("[") and host.endswith("]"):  # an IPv6 address, as a URL writes it
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            raise UsageError(f"--address {shown}: {safe_text(host[:60])} is not an IPv6 address") from None
        return
    if len(host) > MAX_HOST:
        raise UsageError(f"--address {shown}: the host name is {len(host):,} characters, more than the "
                         f"{MAX_HOST} a host name may have")
    if not all(_LABEL.fullmatch(part) for part in host.split(".")):
        raise UsageError(f"--address {shown}: the host name may hold letters, digits, '-' and '_' in "
                         "dot-separated parts of 1 to 63 characters")


def _check_client(where: Address, address: str) -> None:
    """UsageError when ``ray://`` is asked for without Ray's client (``ray[client]``: grpcio)."""
    if where.client and importlib.util.find_spec("grpc") is None:
        raise UsageError(f"--address {safe_text(address[:80])}: ray:// needs Ray's client; install it with: "
                         "pip install 'ray[client]'")


def _check_reachable(where: Address, address: str) -> None:
    """InputError when the host does not accept a connection on the port within CONNECT_TIMEOUT_S
    (Ray itself retries for minutes)."""
    import socket

    try:
        socket.create_connection((where.host, where.port), timeout=CONNECT_TIMEOUT_S).close()
    except (OSError, UnicodeError, ValueError) as e:  # UnicodeError: a name IDNA cannot encode
        raise InputError(f"--address {safe_text(address[:80])}: no Ray cluster answers there "
                         f"({os_cause(e)})") from None


def _init_ray(ray: Any, jobs: int, address: str | None) -> None:
    import logging

    quiet = {"log_to_driver": False, "logging_level": logging.ERROR, "include_dashboard": False}
    try:
        if address is not None:
            ray.init(address=address, **quiet)  # the workers import tracekit from the nodes' installation
        else:
            ray.init(num_cpus=jobs, object_store_memory=_RAY_OBJECT_STORE, **quiet)
    except ConnectionError as e:
        raise InputError(f"--address {safe_text(address)}: cannot connect to a Ray cluster ({e})") from None
    except Exception as e:  # Ray fails in many types (RuntimeError, ValueError, an ImportError of an extra)
        where = f"at --address {safe_text(address[:80])}" if address is not None else "on this machine"
        cause = str(e).splitlines()[0][:200] if str(e) else ""
        raise TracekitError(f"Ray could not start a session {where} ({type(e).__name__}: "
                            f"{safe_text(cause)})") from None
