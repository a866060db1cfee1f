"""CuPy's per-thread hook registry: ``with hook:`` registers it in the calling thread only."""

import threading

_local = threading.local()


def get_memory_hooks():  # type: ignore[no-untyped-def]
    if not hasattr(_local, "hooks"):
        _local.hooks = {}
    return _local.hooks


class MemoryHook:
    name = "MemoryHook"

    def __enter__(self):  # type: ignore[no-untyped-def]
        hooks = get_memory_hooks()
        if self.name in hooks:
            raise RuntimeError(f"hook {self.name} already exists")
        hooks[self.name] = self
        return self

    def __exit__(self, *exc):  # type: ignore[no-untyped-def]
        del get_memory_hooks()[self.name]  # KeyError where it was never registered, as in CuPy

    def alloc_preprocess(self, **kw):  # type: ignore[no-untyped-def]
        pass

    def alloc_postprocess(self, **kw):  # type: ignore[no-untyped-def]
        pass

    def malloc_preprocess(self, **kw):  # type: ignore[no-untyped-def]
        pass

    def malloc_postprocess(self, **kw):  # type: ignore[no-untyped-def]
        pass

    def free_preprocess(self, **kw):  # type: ignore[no-untyped-def]
        pass

    def free_postprocess(self, **kw):  # type: ignore[no-untyped-def]
        pass
