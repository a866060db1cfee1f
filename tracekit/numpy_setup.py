"""NumPy loaded as the verbs that read traces want it: one BLAS thread, no huge pages asked for.

Each setting is an environment variable NumPy reads once, when it is loaded:

- ``OPENBLAS_NUM_THREADS=1``. NumPy's bundled OpenBLAS starts a thread per core when it is
  loaded, and those threads spin for a while before they sleep (NumPy's issue 29193: 1.28 s of
  CPU for one ``import numpy`` on a many-core machine, 0.05 s with one thread). tracekit's verbs
  and worker processes never multiply a matrix: they would pay that on every start, and advise's
  replay threads or fleet's sixteen workers would share the cores with them.
  ``scripts/probe_import_floor.py`` measures the import both ways.
- ``NUMPY_MADVISE_HUGEPAGE=0``. NumPy asks the kernel for transparent huge pages
  (``madvise(MADV_HUGEPAGE)``) on every array of 4 MiB or more. A verb's arrays are written once,
  front to back, and read a few times in order (the columns, the pairing, a replay's input), so a
  huge page saves little on lookups, while its first touch makes the kernel find, zero and (in a
  virtual machine whose balloon reports free memory to its host) have the host back 2 MiB at once.
  On the 2-core machine a whole ``replay --sim best-fit`` of 10M events took 3.2–3.7 s with them
  (1.9–2.3 s of it system CPU) and 2.1 s without (0.4–0.5 s), the user CPU the same
  (docs/performance.md, "Huge pages").

A variable the user set stands, and the environment is put back as it was once NumPy is loaded, so
no process a verb starts (a rerun of the user's program) inherits these settings.
"""

from __future__ import annotations

import os
import sys

SETTINGS: dict[str, str] = {"OPENBLAS_NUM_THREADS": "1", "NUMPY_MADVISE_HUGEPAGE": "0"}


def load_numpy() -> None:
    """Import NumPy under ``SETTINGS``, each one only where the user has not set that variable, then
    put the environment back as it was. Nothing is done where NumPy is loaded already."""
    if "numpy" in sys.modules:
        return
    ours = [name for name in SETTINGS if name not in os.environ]
    os.environ.update({name: SETTINGS[name] for name in ours})
    try:
        import numpy  # noqa: F401  (loaded here, under the settings)
    finally:
        for name in ours:
            del os.environ[name]
