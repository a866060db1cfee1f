"""``plain``: numba's ``njit`` for kernels that make no arrays, without numba's reference counting.

numba counts references to every array a compiled function holds: a function that takes arrays
increments each one's count on entry and decrements it on the way out, with atomic instructions
(``lock inc``/``lock dec``), in every call that LLVM could not see through. The simulator's kernels
call small helpers with four or five arrays each (the node table, the size classes' roots and
bitmap, the scalar state) several times per event: the best fit of 10M events spent more than half
of its time in those counts (``perf``: two instructions, ``lock incq`` and ``lock decq`` in numba's
``NRT_incref``/``NRT_decref``), and an atomic instruction costs more on the 16-core host's Xeon than
on the development machine's EPYC, which is why the same kernel ran 2.4x slower there against 1.5x
for the C++ loop (docs/performance.md). A function compiled with ``_nrt=False`` (numba's option
for compiling without its runtime) counts nothing: its callers' arrays stay alive in the caller,
which holds them for the whole call, so nothing is lost by not counting them again.

What a ``plain`` function may not do: make an array, or take one from a compiled function that
made it (numba refuses to compile either: a typing error at the first call, loud), or return one,
or a tuple holding one (the caller would take a reference that was never counted and free the array
under its owner). numba refuses to return a view; an argument handed back it compiles, so
``check()`` looks at every signature compiled so far and names any plain function whose result
holds an array; the package's precompile step runs it after compiling every kernel (the build fails
on a finding), and a test runs it after replaying through every policy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from numba import njit
from numba.core import types

__all__ = ["check", "plain"]

_PLAIN: list[Any] = []  # every dispatcher made by ``plain``


def plain(fn: Callable[..., Any] | None = None, **options: Any) -> Any:
    """``njit(cache=True, _nrt=False, **options)``: as ``@plain`` or ``@plain(inline="always")``."""

    def wrap(f: Callable[..., Any]) -> Any:
        compile_: Any = njit  # numba's stubs name its public options only; _nrt is its own, long-standing
        dispatcher = compile_(cache=True, _nrt=False, **options)(f)
        _PLAIN.append(dispatcher)
        return dispatcher

    return wrap(fn) if fn is not None else wrap


def _holds_array(t: types.Type) -> bool:
    if isinstance(t, (types.Array, types.Buffer)):
        return True
    if isinstance(t, types.BaseTuple):
        return any(_holds_array(x) for x in getattr(t, "types", ()))
    return isinstance(t, (types.List, types.DictType, types.ListType))


def check() -> list[str]:
    """The plain functions compiled in this process (loaded from the cache or not) whose result
    holds an array: one sentence each, naming the function (see the module)."""
    bad = []
    for d in _PLAIN:
        name = f"{d.py_func.__module__}.{d.py_func.__qualname__}"
        for sig in d.nopython_signatures:
            if _holds_array(sig.return_type):
                bad.append(f"{name} returns {sig.return_type}")
    return bad
