"""What a Cython module that ``cimport``s ``cupy.cuda.memory`` does when it is first imported.

Cython's module init calls ``__Pyx_ImportType`` for every extension type it
cimports: the object under that name in the module's namespace must be a type
no smaller than the module was compiled against (larger only warns: Cython's
default ``check_size='warn'``), and ``__Pyx_GetVtable``
then reads ``__pyx_vtable__`` from that type's *own* ``__dict__`` (a Python
subclass inherits the attribute but has no such key: ``KeyError:
'__pyx_vtable__'``, as ``cupyx._cusolver`` failed under tracekit 0.2).
Arguments typed with such a type are checked with ``isinstance`` against the
type found at import.
"""

import warnings
from types import ModuleType


def import_type(module: ModuleType, name: str):  # type: ignore[no-untyped-def]
    """The extension type ``module.name``, checked as ``__Pyx_ImportType`` and ``__Pyx_GetVtable`` do."""
    obj = getattr(module, name)
    if not isinstance(obj, type):
        raise TypeError(f"{module.__name__}.{name} is not a type object")
    _, size = module.COMPILED_AGAINST[name]
    if obj.__basicsize__ != size:
        text = (f"{module.__name__}.{name} size changed, may indicate binary incompatibility. "
                f"Expected {size} from C header, got {obj.__basicsize__} from PyObject")
        if obj.__basicsize__ < size:
            raise ValueError(text)
        warnings.warn(text, RuntimeWarning, stacklevel=2)
    obj.__dict__["__pyx_vtable__"]  # the KeyError, where the type holds no vtable of its own
    return obj


def check_arg(value, cls, name):  # type: ignore[no-untyped-def]
    """A typed argument (``def f(MemoryPointer ptr)``): ``TypeError`` unless an instance of ``cls``."""
    if value is not None and not isinstance(value, cls):
        raise TypeError(f"Argument '{name}' has incorrect type (expected {cls.__module__}.{cls.__name__}, "
                        f"got {type(value).__name__})")
