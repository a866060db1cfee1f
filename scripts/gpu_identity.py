"""On a GPU machine: does recording change any attribute of real CuPy (issue: nothing of CuPy's replaced)?

Snapshots every attribute of CuPy's memory-related modules, starts a real ``CupyRecording``,
allocates through the default pool, a pool of the program's own and ``using_allocator``, and
compares identity, ``__name__``, ``__qualname__`` and pickling by reference while recording and
after, against the same steps run without recording (what the program itself changes). Prints
one JSON object: {"modules": [...], "attributes": N, "plain": [...], "recorded": [...]}.
    python3 scripts/gpu_identity.py none|plain|async
"""

from __future__ import annotations

import json
import pickle
import sys
import types
from pathlib import Path

import cupy
import cupy.cuda.memory
import cupy.cuda.memory_hook
import cupy.cuda.pinned_memory
import cupy.cuda.runtime
import cupy_backends.cuda.api.runtime

MODULES = [cupy, cupy.cuda, cupy.cuda.memory, cupy.cuda.memory_hook, cupy.cuda.pinned_memory,
           cupy.cuda.runtime, cupy_backends.cuda.api.runtime]


def snapshot() -> dict[str, dict[str, object]]:
    return {m.__name__: dict(vars(m)) for m in MODULES}


def pickles_to_itself(obj: object) -> bool | None:
    if not isinstance(obj, (type, types.FunctionType, types.BuiltinFunctionType)) and \
            type(obj).__name__ != "cython_function_or_method":
        return None
    try:
        return pickle.loads(pickle.dumps(obj)) is obj
    except Exception:
        return False


def changed(before: dict[str, dict[str, object]], where: str) -> list[str]:
    out = []
    for m in MODULES:
        now, then = vars(m), before[m.__name__]
        for name in sorted(then):
            if name == "__builtins__":
                continue
            if name not in now or now[name] is not then[name]:
                out.append(f"{where}: {m.__name__}.{name} is another object")
                continue
            obj = now[name]
            for attr in ("__name__", "__qualname__"):
                if getattr(obj, attr, None) != getattr(then[name], attr, None):
                    out.append(f"{where}: {m.__name__}.{name}.{attr}")
            if pickles_to_itself(obj) is False and pickles_to_itself(then[name]) is not False:
                out.append(f"{where}: {m.__name__}.{name} does not pickle to itself")
        for name in sorted(set(now) - set(then)):
            if not isinstance(now[name], types.ModuleType):
                out.append(f"{where}: {m.__name__}.{name} was added")
    return out


def main() -> None:
    mode = sys.argv[1]
    before = snapshot()
    rec = None
    if mode != "none":
        from tracekit.record.session import CupyRecording

        rec = CupyRecording(Path(f"/tmp/identity-{mode}.parquet"), command=["x"], force=True,
                            async_pools=mode == "async")
        rec.start()
    during = changed(before, "recording")
    a = cupy.arange(1000)
    user = cupy.cuda.MemoryPool()
    cupy.cuda.set_allocator(user.malloc)
    b = cupy.ones(5000)
    with cupy.cuda.using_allocator(cupy.cuda.MemoryPool().malloc):
        c = cupy.zeros(7000)
    cupy.cuda.set_allocator(cupy.get_default_memory_pool().malloc)
    del a, b, c
    during += changed(before, "after allocating")
    if rec is not None:
        rec.stop({"code": 0})
    n = sum(len(v) for v in before.values())
    print(json.dumps({"mode": mode, "modules": [m.__name__ for m in MODULES], "attributes": n,
                      "during": during, "after": changed(before, "stopped")}))


if __name__ == "__main__":
    main()
