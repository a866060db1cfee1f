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
