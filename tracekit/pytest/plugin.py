"""The pytest hooks: GPU memory per test, budgets as markers, a table of the highest peaks.

Off unless asked for: ``--gpu-memory`` (or ``--gpu-memory-traces``) measures every test, a
``limit_gpu_memory``/``limit_gpu_leaks`` marker measures its test. Only the test's call is
measured (not its fixtures). This module imports pytest and the standard library only; CuPy,
PyTorch and tracekit's recorder load with the first measured test. Everything a test measured
travels in its report's ``user_properties``, so under pytest-xdist each worker measures its own
tests and the controller prints the table. See ``docs/pytest.md``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

PROPERTY = "tracekit_gpu_memory"
METRICS = ("reserved", "allocated", "device")
MEASURE_MARKERS = ("limit_gpu_memory", "limit_gpu_leaks")


class MarkerError(Exception):
    """A budget marker used wrongly (the message says how to use it)."""


@dataclass(frozen=True)
class Plan:
    """What one test is measured for."""

    memory: tuple[int, str] | None = None  # (budget bytes, metric)
    leaks: tuple[int, int] | None = None  # (budget bytes, warm-ups)

    @property
    def marked(self) -> bool:
        return self.memory is not None or self.leaks is not None


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("tracekit", "GPU memory per test (tracekit)")
    group.addoption("--gpu-memory", action="store_true", default=False,
                    help="Measure every test's GPU memory (CuPy pools, PyTorch's caching allocator) and "
                         "print the tests with the highest peaks.")
    group.addoption("--gpu-memory-traces", metavar="DIR[=all]", default=None,
                    help="Keep each failing measured test's trace in DIR (DIR=all: every test's), "
                         "named by test id, for `tracekit analyze`/`report`. Implies --gpu-memory.")
    group.addoption("--gpu-memory-top", type=int, default=10, metavar="N",
                    help="Rows of the --gpu-memory table (10).")
    group.addoption("--gpu-memory-no-advise", action="store_true", default=False,
                    help="Do not run advise on a test over a capacity budget.")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "limit_gpu_memory(size, metric): fail the test if its peak GPU memory exceeds size "
                   "(metric 'reserved', 'allocated' or 'device'; tracekit)")
    config.addinivalue_line(
        "markers", "limit_gpu_leaks(size, warmups=0): fail the test if more than size of GPU memory is "
                   "still allocated after it, after warmups unmeasured calls (tracekit)")
    config.pluginmanager.register(GpuMemory(config), "tracekit-gpu-memory-state")


def parse_traces(value: str | None) -> tuple[Path | None, bool]:
    """(folder, every test) of ``--gpu-memory-traces DIR[=all]``."""
    if value is None:
        return None, False
    folder, sep, mode = value.rpartition("=")
    if sep and mode in ("all", "failed"):
        return Path(folder).resolve(), mode == "all"
    return Path(value).resolve(), False


def trace_name(nodeid: str) -> str:
    """A file name for the test ``nodeid`` (kept readable; long ids end in a hash)."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", nodeid).strip("_.") or "test"
    if len(safe) > 150:
        safe = safe[:120] + "-" + hashlib.sha1(nodeid.encode()).hexdigest()[:12]
    return safe + ".parquet"


def _size(value: Any, marker: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    if isinstance(value, str):
        from tracekit.errors import UsageError
        from tracekit.units import parse_size

        try:
            n = parse_size(value, f"{marker} size")
        except UsageError as e:
            raise MarkerError(f"@pytest.mark.{marker}: {e}") from None
        if n > 0:
            return n
    raise MarkerError(f"@pytest.mark.{marker}: the size must be a positive number of bytes or a string "
                      f"such as \"8 GiB\", not {value!r}")


def plan_of(item: pytest.Item) -> Plan:
    """The budgets of ``item``'s markers (the closest marker of each kind), or MarkerError."""
    memory = leaks = None
    mark = item.get_closest_marker("limit_gpu_memory")
    if mark is not None:
        usage = '@pytest.mark.limit_gpu_memory("8 GiB", metric="reserved"|"allocated"|"device")'
        if len(mark.args) != 1 or set(mark.kwargs) - {"metric"}:
            raise MarkerError(f"{usage}: give one size and the metric, got args={mark.args!r} "
                              f"kwargs={mark.kwargs!r}")
        metric = mark.kwargs.get("metric")
        if metric not in METRICS:
            raise MarkerError(f"{usage}: metric= is required and must be one of {', '.join(METRICS)} "
                              f"(\"peak\" alone is ambiguous), got {metric!r}")
        memory = (_size(mark.args[0], "limit_gpu_memory"), str(metric))
    mark = item.get_closest_marker("limit_gpu_leaks")
    if mark is not None:
        usage = '@pytest.mark.limit_gpu_leaks("1 MiB", warmups=N)'
        if len(mark.args) != 1 or set(mark.kwargs) - {"warmups"}:
            raise MarkerError(f"{usage}: give one size (and warmups=), got args={mark.args!r} "
                              f"kwargs={mark.kwargs!r}")
        warmups = mark.kwargs.get("warmups", 0)
        if not isinstance(warmups, int) or isinstance(warmups, bool) or warmups < 0:
            raise MarkerError(f"{usage}: warmups must be an int >= 0, got {warmups!r}")
        leaks = (_size(mark.args[0], "limit_gpu_leaks"), warmups)
    return Plan(memory, leaks)


PLAN = pytest.StashKey[Plan]()
MEASURED = pytest.StashKey[dict[str, Any]]()
BACKENDS = pytest.StashKey[tuple[str, ...]]()


class GpuMemory:
    """The plugin's state in this process (each xdist worker has its own)."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.traces, self.keep_all = parse_traces(config.getoption("gpu_memory_traces"))
        self.every = bool(config.getoption("gpu_memory")) or self.traces is not None
        self.top = int(config.getoption("gpu_memory_top"))
        self.advise = not config.getoption("gpu_memory_no_advise")
        self.results: list[tuple[str, dict[str, Any]]] = []
        self._cupy: tuple[Any, int] | str | None = None  # (cupy, devices) or why not
        self._torch: tuple[Any, int] | str | None = None
        self._tmp: str | None = None

    # -- which library ------------------------------------------------------------------------
    def _cupy_state(self) -> tuple[Any, int] | str:
        if self._cupy is None:
            if importlib.util.find_spec("cupy") is None:
                self._cupy = "CuPy is not installed"
            else:
                try:
                    from tracekit.pytest.cupy_meter import import_cupy

                    self._cupy = import_cupy()
                except Exception as e:
                    self._cupy = str(e)
        return self._cupy

    def _torch_state(self, cupy_ok: bool) -> tuple[Any, int] | str:
        if self._torch is None or (isinstance(self._torch, str) and "torch" in sys.modules):
            # PyTorch is measured when the tests imported it, or when it is the only library there
            if "torch" not in sys.modules and (cupy_ok or importlib.util.find_spec("torch") is None):
                return "PyTorch is not imported" if cupy_ok else "PyTorch is not installed"
            try:
                from tracekit.pytest.torch_meter import import_torch

                self._torch = import_torch()
            except Exception as e:
                self._torch = str(e)
        return self._torch

    def _meters(self, history: bool) -> tuple[list[Any], str]:
        """The meters for a test now, and why there are none."""
        meters: list[Any] = []
        cupy = self._cupy_state()
        if not isinstance(cupy, str):
            from tracekit.pytest.cupy_meter import CupyMeter

            meters.append(CupyMeter(cupy[0], cupy[1], None))
        torch = self._torch_state(not isinstance(cupy, str))
        if not isinstance(torch, str):
            from tracekit.pytest.torch_meter import TorchMeter

            meters.append(TorchMeter(torch[0], torch[1], history=history))
        why = "; ".join(x for x in (cupy, torch) if isinstance(x, str))
        return meters, why

    # -- hooks ------------------------------------------------------------------------------------
    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        if not self.every and all(item.get_closest_marker(n) is None for n in MEASURE_MARKERS):
            return
        try:
            plan = plan_of(item)
        except MarkerError as e:
            pytest.fail(str(e), pytrace=False)
        if plan.marked:
            meters, why = self._meters(history=False)
            if not meters:
                _skip(f"GPU memory budget not measurable: {why}")
        item.stash[PLAN] = plan

    @pytest.hookimpl(wrapper=True)
    def pytest_pyfunc_call(self, pyfuncitem: pytest.Function) -> Any:
        plan = pyfuncitem.stash.get(PLAN, None)
        if plan is None:
            return (yield)
        # a PyTorch trace needs the history on from the start: kept traces, or a budget to explain
        meters, _why = self._meters(history=self.traces is not None or plan.memory is not None)
        if not meters:
            return (yield)
        if plan.leaks is not None and plan.leaks[1]:
            args = {a: pyfuncitem.funcargs[a] for a in pyfuncitem._fixtureinfo.argnames}
            for _ in range(plan.leaks[1]):
                pyfuncitem.obj(**args)
        for m in meters:
            m.start()
        try:
            result = yield
        except BaseException as exc:
            self._finish(pyfuncitem, plan, meters, exc)
            raise
        failure = self._finish(pyfuncitem, plan, meters, None)
        if failure is not None:
            pytest.fail(failure, pytrace=False)
        return result

    def _finish(self, item: pytest.Function, plan: Plan, meters: list[Any],
                exc: BaseException | None) -> str | None:
        """Stop the meters; the failure message of a test over budget (None: within)."""
        if plan.leaks is not None:
            import gc

            gc.collect()  # blocks held only by cycles the test left are not leaks
        measured = [(m, m.stop()) for m in meters]
        self.config.stash[BACKENDS] = tuple(m.backend for m in meters)
        item.stash[MEASURED] = {"measurements": [x.to_json() for _, x in measured]}
        failures: list[str] = []
        for meter, m in measured:
            trace: Path | None = None
            trace_error: str | None = None
            over = None
            if plan.memory is not None:
                budget, metric = plan.memory
                device, peak = m.peak(metric)
                if peak is not None and peak > budget:
                    over = (metric, peak, budget, device)
            leak = plan.leaks is not None and m.leaked() > plan.leaks[0]
            failed = exc is not None or over is not None or leak
            if self.keep_all or (failed and (self.traces is not None or over is not None)):
                trace, trace_error = self._write(meter, item, exc, keep=self.traces is not None)
            if exc is not None and (text := _oom_text(meter, exc)):
                note = f"tracekit: the GPU memory at this out-of-memory error\n{text}"
                if trace is not None:
                    note += f"\ntrace: {trace} (tracekit analyze {trace})"
                with _suppress():
                    exc.add_note(note)
            if over is not None:
                from tracekit.pytest.verdict import message

                metric, peak, budget, device = over
                failures.append(message(metric=metric, peak=peak, budget=budget, device=device,
                                        backend=m.backend, trace_path=trace, trace_error=trace_error,
                                        run_advise=self.advise, kept=self.traces is not None))
            if leak and plan.leaks is not None:
                from tracekit.pytest.verdict import leak_message

                failures.append(leak_message(leaked=m.leaked(), budget=plan.leaks[0], warmups=plan.leaks[1],
                                             backend=m.backend,
                                             trace_path=trace if self.traces is not None else None))
        return "\n\n".join(failures) if failures else None

    def _write(self, meter: Any, item: pytest.Function, exc: BaseException | None,
               *, keep: bool) -> tuple[Path | None, str | None]:
        if keep and self.traces is not None:
            folder = self.traces
        else:
            if self._tmp is None:
                self._tmp = tempfile.mkdtemp(prefix="tracekit-pytest-")
            folder = Path(self._tmp)
        from tracekit.pytest.measure import Backend

        name = trace_name(item.nodeid)
        if len(self.config.stash.get(BACKENDS, ())) > 1 and meter.backend is Backend.TORCH:
            name = name.removesuffix(".parquet") + ".torch.parquet"  # beside the CuPy one
        try:
            out = meter.write_trace(folder / name, nodeid=item.nodeid, exception=exc)
        except Exception as e:
            return None, f"writing it failed: {type(e).__name__}: {e}"
        return out, None if out is not None else "no allocation history was recorded"

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
        # On the item, before the call's report is made from it: that report carries it to
        # logreport (and to the controller under xdist), and the teardown's to the JUnit XML,
        # which takes a test's properties from its teardown report.
        if call.when == "call":
            got = item.stash.get(MEASURED, None)
            if got is not None and not any(k == PROPERTY for k, _ in item.user_properties):
                item.user_properties.append((PROPERTY, got))
        return (yield)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "call":
            return
        for key, value in report.user_properties:
            if key == PROPERTY and isinstance(value, dict):
                self.results.append((report.nodeid, value))

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.every or hasattr(self.config, "workerinput"):
            return
        from tracekit.pytest.summary import table

        lines = table(self.results, self.top)
        terminalreporter.write_sep("=", "GPU memory (tracekit): highest peaks")
        for line in lines:
            terminalreporter.write_line(line)
        if self.traces is not None:
            terminalreporter.write_line(f"traces: {self.traces}")

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)


def _skip(reason: str) -> None:
    """Skip the test, reported at the test's own line (as a skip marker is), not the plugin's."""
    try:
        exc = pytest.skip.Exception(reason, _use_item_location=True)  # type: ignore[call-arg]
    except TypeError:  # a pytest without the keyword
        pytest.skip(reason)
    raise exc


def _oom_text(meter: Any, exc: BaseException) -> str | None:
    try:
        text: str | None = meter.oom_text(exc)
        return text
    except Exception:
        return None


def _suppress() -> Any:
    import contextlib

    return contextlib.suppress(Exception)
