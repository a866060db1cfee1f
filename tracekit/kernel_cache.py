"""Where numba keeps tracekit's compiled kernels when tracekit's own folder is not writable.

The build compiles every kernel into numba's cache beside the sources (``setup.py``), and numba
uses a cache folder only where it may write (it checks when a kernel module is imported), then its
user-wide folder under ``~/.cache``. A user without write access to a shared install and without a
writable home (a service account, ``nobody``) would get ``RuntimeError: cannot cache function ...:
no locator available`` from every verb that runs a kernel. ``settle()`` then points numba at a
folder of the user's own in the temporary directory (the kernels compile once there, then load),
unless ``NUMBA_CACHE_DIR`` is set. It changes the process's environment, so the recorder calls it
only once the recorded program has ended (``record.runner.epilogue``), never before.
"""

from __future__ import annotations

import os
import sys
import tempfile
from types import FrameType

HERE = os.path.dirname(os.path.abspath(__file__))


def settle() -> None:
    """Give numba a cache folder it may write, where neither tracekit's nor the user's is one."""
    if os.environ.get("NUMBA_CACHE_DIR") or os.access(HERE, os.W_OK):
        return
    home = os.path.expanduser("~")
    if os.path.isdir(home) and os.access(home, os.W_OK):
        return  # numba's user-wide folder (~/.cache/numba) will do
    folder = os.path.join(tempfile.gettempdir(), f"tracekit-kernels-{os.getuid()}")
    numba = sys.modules.get("numba")
    if numba is not None:  # already imported (by the recorded program): its config is read by now
        numba.config.CACHE_DIR = folder
    else:
        os.environ["NUMBA_CACHE_DIR"] = folder


# numba and SciPy. numba imports SciPy where it is installed, though tracekit's kernels never
# reach it: ``numba/__init__.py`` imports ``scipy`` to check its version, and the first kernel a
# process compiles or loads from the cache builds the CPU target, whose registries import
# ``numba.np.arraymath``, which imports ``scipy.linalg.cython_blas`` to learn whether ``np.dot``
# may call BLAS (``_HAVE_BLAS``). That costs ``scipy.linalg`` (0.13 s on the 2-core machine) in
# every verb. No numba setting turns the probe off, and importing numba's submodules selectively
# does not avoid it (the target loads all its registries), so ``keep_scipy_from_numba`` refuses
# the imports of SciPy that numba's own code makes (ImportError, which numba takes as "no SciPy":
# ``np.dot`` on floats in a kernel then loops in the kernel instead of calling BLAS, and
# ``np.linalg`` in a kernel would not compile; no tracekit kernel uses either, and the compiled
# kernels in the cache do not depend on it). SciPy imported by anything else is untouched, and a
# SciPy already imported reaches numba as usual. The command line calls it for every verb but
# ``record`` (``cli.app``): the recorded program's numba is the program's own, never changed.
class _NoScipyForNumba:
    """A meta path finder: an import of SciPy made by numba's own code fails."""

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name != "scipy" and not name.startswith("scipy."):
            return
        frame: FrameType | None = sys._getframe(1)
        while frame is not None and frame.f_globals.get("__name__", "").startswith("importlib"):
            frame = frame.f_back  # the import machinery (importlib._bootstrap and the like)
        caller = frame.f_globals.get("__name__", "") if frame is not None else ""
        if caller == "numba" or caller.startswith("numba."):
            raise ModuleNotFoundError(f"tracekit keeps {name} from numba (tracekit.kernel_cache)", name=name)


_SCIPY_FINDER = _NoScipyForNumba()


def keep_scipy_from_numba() -> None:
    """From here on in this process, numba's own imports of SciPy fail (see above); idempotent."""
    if _SCIPY_FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _SCIPY_FINDER)  # type: ignore[arg-type]
