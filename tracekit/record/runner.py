"""Run a program the way ``python SCRIPT ARGS`` or ``python -m MODULE ARGS`` would.

Same ``sys.argv``, a fresh ``__main__`` module (``__file__`` absolute, as
Python 3.9+ sets it), the script's folder (or, for ``-m``, the working
directory) first on ``sys.path``, and the same outcome: the exit code of
``sys.exit``, 1 with the traceback printed through ``sys.excepthook`` for an
uncaught exception (tracekit's own frames trimmed, so the traceback reads as
it would without tracekit), 130 for Ctrl-C, 143 for SIGTERM (raised as
``signals.Terminated`` while ``signals.stop_signals`` is active). Non-daemon
threads are joined before returning, as the interpreter does at exit, except
after a stop signal (a stopped program's workers may never finish). The outcome keeps the
program's globals and the exception alive, so the caller can read the pool's
state as the program left it before anything is freed.
"""

from __future__ import annotations

import builtins
import contextlib
import importlib.machinery
import importlib.util
import io
import itertools
import os
import runpy
import stat
import sys
import threading
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tracekit.errors import InputError, TracekitError, UsageError
from tracekit.record.signals import Terminated, quiet_signals

_SKIP = (os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ""),
         os.path.abspath(runpy.__file__), "<frozen runpy>")


@dataclass
class Outcome:
    """How the program ended: the exit code and, if one escaped, the exception or the signal.

    ``exception`` is the qualified class name (``cupy.cuda.memory.OutOfMemoryError``).
    """

    code: int
    exception: str | None = None
    message: str | None = None
    keepalive: Any = None  # the program's globals or exception, released by the caller
    signal: int | None = None

    @property
    def status(self) -> str:
        """``ok``, ``exception`` or ``signal`` (the ``exit.status`` of trace format v2)."""
        if self.signal is not None:
            return "signal"
        return "exception" if self.exception is not None and self.code != 0 else "ok"

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status, "exception": self.exception, "signal": self.signal,
                "code": self.code, "message": self.message}


def qualified_name(e: BaseException) -> str:
    """``module.Class`` of an exception (just ``Class`` for builtins)."""
    cls = type(e)
    mod = cls.__module__
    return cls.__qualname__ if mod == "builtins" else f"{mod}.{cls.__qualname__}"


def default_output(target: list[str], module: bool) -> Path:
    """tracekit-<script or module>-<pid>.parquet in the working directory."""
    stem = target[0] if module else Path(target[0].rstrip("/")).stem
    return Path(f"tracekit-{stem}-{os.getpid()}.parquet")


def check_target(target: list[str], module: bool) -> None:
    """Fail before anything starts if the script or module does not exist."""
    if not target:
        raise UsageError("give the program to record: SCRIPT [ARGS]... or -m MODULE [ARGS]...")
    name = target[0]
    if module:
        sys.path.insert(0, os.getcwd())
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError) as e:
            raise InputError(f"{name}: cannot find the module ({e})") from None
        finally:
            sys.path.pop(0)
        if spec is None:
            raise InputError(f"{name}: no module of that name (as python -m would look for it)")
    else:
        from tracekit.inputs import check_regular, safe_text, stat_or_none

        st = stat_or_none(name, "script")
        if st is None:
            raise InputError(f"{safe_text(name)}: no such script")
        main = os.path.join(name, "__main__.py") if stat.S_ISDIR(st.st_mode) else name
        if main != name and stat_or_none(main, "script") is None:
            raise InputError(f"{safe_text(name)}: is a folder without __main__.py")
        if stat.S_ISREG(os.stat(main).st_mode):  # a pipe (``<(...)``) is python's to read, as it is
            check_regular(main, "script", readable=True)  # python itself would fail to open it


def run_target(target: list[str], module: bool) -> Outcome:
    """Run ``target`` (``[script, *args]`` or ``[module, *args]``) and return its outcome."""
    saved_argv, saved_path = sys.argv, list(sys.path)
    try:
        keep = _run_module(target) if module else _run_script(target)
        code, exc = 0, None
    except SystemExit as e:
        quiet = e.code in (0, None)
        return _finish(Outcome(_exit_code(e.code), None if quiet else "SystemExit",
                               None if quiet else str(e.code), e))
    except Terminated as e:
        tell(f"tracekit: the program was {e}; writing what was recorded")
        return _finish(Outcome(128 + e.signum, None, str(e), None, e.signum), join=False)
    except KeyboardInterrupt as e:
        _report(e)
        return _finish(Outcome(130, "KeyboardInterrupt", str(e), e, 2), join=False)
    except BaseException as e:
        _report(e)
        return _finish(Outcome(1, qualified_name(e), str(e), e))
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
    return _finish(Outcome(code, exc, None, keep))


def _run_script(target: list[str]) -> Any:
    script = target[0]
    sys.argv = list(target)
    sys.path.insert(0, os.path.dirname(os.path.realpath(script)))
    if os.path.isdir(script) or not _is_source(script):
        return runpy.run_path(script, run_name="__main__")  # a folder or zip with __main__.py
    path = os.path.abspath(script)
    with io.open_code(path) as f:
        source = f.read()
    code = compile(source, path, "exec", dont_inherit=True)  # python names the frame by abspath
    main = types.ModuleType("__main__")
    main.__dict__.update(
        __file__=path, __builtins__=builtins, __spec__=None, __package__=None, __cached__=None,
        __loader__=importlib.machinery.SourceFileLoader("__main__", path),
    )
    sys.modules["__main__"] = main
    exec(code, main.__dict__)
    return main


def _is_source(path: str) -> bool:
    with open(path, "rb") as f:
        return f.read(4) != b"PK\x03\x04"  # not a zip application


def _run_module(target: list[str]) -> Any:
    sys.argv = list(target)
    sys.path.insert(0, os.getcwd())
    return runpy.run_module(target[0], run_name="__main__", alter_sys=True)


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    if sys.stderr is not None:  # as the interpreter prints sys.exit's message: where it can
        with contextlib.suppress(Exception):
            print(code, file=sys.stderr)
    return 1


def _report(e: BaseException) -> None:
    """Print the traceback the way the interpreter would, without tracekit's frames (the runner's
    at the top, and those of the functions the recorder put under CuPy's names, anywhere in the
    traceback and in the exceptions it chains)."""
    seen: set[int] = set()
    x: BaseException | None = e
    while x is not None and id(x) not in seen:
        seen.add(id(x))
        x.__traceback__ = _without_tracekit(x.__traceback__)
        x = x.__cause__ or x.__context__
    flush_streams()
    sys.excepthook(type(e), e, e.__traceback__)  # prints nothing where sys.stderr is None
    flush_streams()


def _without_tracekit(tb: types.TracebackType | None) -> types.TracebackType | None:
    """``tb`` with every frame of tracekit's (and runpy's) left out, the others linked as they were."""
    kept = []
    while tb is not None:
        if not tb.tb_frame.f_code.co_filename.startswith(_SKIP):
            kept.append(tb)
        tb = tb.tb_next
    for a, b in itertools.pairwise(kept):
        a.tb_next = b
    if kept:
        kept[-1].tb_next = None
    return kept[0] if kept else None


def flush_streams() -> None:
    """Flush the program's ``sys.stdout`` and ``sys.stderr`` if it left them usable (it may have set
    them to None or closed their descriptors: then the interpreter's own exit reports it, as
    without tracekit)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


def tell(text: str) -> None:
    """Write one line of tracekit's own on descriptor 2 after the program's output, whatever the
    program did with ``sys.stderr`` (None, replaced, closed); nothing if descriptor 2 is closed."""
    from tracekit.inputs import safe_text

    flush_streams()
    with contextlib.suppress(OSError):
        os.write(2, (safe_text(text, lines=True) + "\n").encode("utf-8", "backslashreplace"))


def _finish(outcome: Outcome, join: bool = True) -> Outcome:
    me = threading.current_thread()
    for t in threading.enumerate() if join else ():
        if t is not me and not t.daemon:
            t.join()
    flush_streams()
    return outcome


@dataclass(frozen=True)
class Recorded:
    """What a recording left: the trace (None where none was written), the program's exit code,
    and, where the trace could not be finished, why (one sentence)."""

    path: Path | None
    code: int
    problem: str | None = None
    # the signal the process dies of once the trace is written, as python does for a KeyboardInterrupt
    # that ends the program (it re-raises SIGINT; the shell then sees a death by SIGINT, not 130)
    dies_of: int | None = None
    # the output asked for, where the program made its own file there and ``path`` is beside it
    taken: Path | None = None


def epilogue(pid: int, outcome: Outcome, write: Callable[[], Path], output: Path | None = None) -> Recorded:
    """Write the trace with ``write()`` in the process that started the recording (``pid``), with
    stop signals held; a forked child of the program that returns here writes nothing. A failure
    to write becomes ``problem``: the program's exit code stands either way. ``write`` returns
    where the trace went: a path other than ``output`` (the program made its own file there) is
    told through ``Recorded.taken``."""
    if os.getpid() != pid:
        outcome.keepalive = None
        return Recorded(None, outcome.code)
    limit = sys.getrecursionlimit()  # the program's own, restored after: finishing needs its depth
    sys.setrecursionlimit(max(limit, 1000))
    from tracekit.kernel_cache import settle

    settle()  # the program has ended: the kernels that write the trace need a cache they may use
    sig = outcome.signal if outcome.exception == "KeyboardInterrupt" else None
    with quiet_signals():
        try:
            path = write()
            taken = output if output is not None and path != output else None
            return Recorded(path, outcome.code, dies_of=sig, taken=taken)
        except TracekitError as e:
            return Recorded(None, outcome.code, str(e), sig)
        except Exception as e:  # never a traceback after the program ran: say what failed
            return Recorded(None, outcome.code, f"could not write the trace ({type(e).__name__}: {e})", sig)
        finally:
            outcome.keepalive = None
            sys.setrecursionlimit(limit)
