"""NumPy loaded with one BLAS thread, in processes that never multiply a matrix.

NumPy's bundled OpenBLAS starts a thread per core when it is loaded, unless
``OPENBLAS_NUM_THREADS`` says otherwise, and those threads spin for a while before they sleep
(NumPy's issue 29193: 1.28 s of CPU for one ``import numpy`` on a many-core machine, 0.05 s with
one thread). tracekit's verbs that read traces, and its worker processes, never multiply a matrix:
they would pay that on every start, and advise's replay threads or fleet's sixteen workers would
share the cores with them. ``scripts/probe_import_floor.py`` measures the import both ways.
"""

from __future__ import annotations

import os
import sys

VARIABLE = "OPENBLAS_NUM_THREADS"


def load_numpy_with_one_blas_thread() -> None:
    """Import NumPy with one BLAS thread, then put the environment back as it was, so no process
    started later (a rerun of the user's program) inherits the setting. Nothing is done where NumPy
    is loaded already or the user set the variable (their value stands)."""
    if VARIABLE in os.environ or "numpy" in sys.modules:
        return
    os.environ[VARIABLE] = "1"
    try:
        import numpy  # noqa: F401  (loaded here, under the setting)
    finally:
        del os.environ[VARIABLE]
