"""NumPy loaded as the verbs that read traces want it: one BLAS thread; no huge pages where they cost.

Each setting is an environment variable NumPy reads once, when it is loaded:

- ``OPENBLAS_NUM_THREADS=1``. NumPy's bundled OpenBLAS starts a thread per core when it is
  loaded, and those threads spin for a while before they sleep (NumPy's issue 29193: 1.28 s of
  CPU for one ``import numpy`` on a many-core machine, 0.05 s with one thread). tracekit's verbs
  and worker processes never multiply a matrix: they would pay that on every start, and advise's
  replay threads or fleet's sixteen workers would share the cores with them.
  ``scripts/probe_import_floor.py`` measures the import both ways (on an H100 machine's 16-core
  host no difference showed: its ``import numpy`` is the shared library's load from disk).
- ``NUMPY_MADVISE_HUGEPAGE=0``, in a virtual machine whose balloon reports free memory to its host
  (``free_pages_reported``). NumPy asks the kernel for transparent huge pages
  (``madvise(MADV_HUGEPAGE)``) on every array of 4 MiB or more. Such a guest hands free blocks of
  2 MiB and more to its host, which takes them back; a huge page is one of those blocks, so its
  first touch is likely a fault on the host for all of it, while small pages come mostly from
  smaller free blocks the host still backs. On the 2-core machine (such a guest) a whole ``replay --sim
  best-fit`` of 10M events took 3.2–3.5 s with huge pages (1.7–2.1 s of it system CPU) and
  2.1 s without (0.4–0.5 s), the user CPU the same; the read alone 2.1–2.3 s against 1.1 s after
  a pause (docs/performance.md, "Huge pages"). Elsewhere NumPy asks for them as it does by itself.

A variable the user set stands, and the environment is put back as it was once NumPy is loaded, so
no process a verb starts (a rerun of the user's program) inherits these settings.
"""

from __future__ import annotations

import os
import sys

BLAS_THREADS = ("OPENBLAS_NUM_THREADS", "1")
NO_HUGE_PAGES = ("NUMPY_MADVISE_HUGEPAGE", "0")

# The virtio balloon's devices, each with its negotiated feature bits as a string of 0s and 1s
# (bit 0 first); bit 5 is VIRTIO_BALLOON_F_REPORTING (free page reporting, Linux 5.7+).
BALLOON_DEVICES = "/sys/bus/virtio/drivers/virtio_balloon"
FREE_PAGE_REPORTING_BIT = 5


def free_pages_reported(devices: str = BALLOON_DEVICES) -> bool:
    """Whether this machine is a virtual machine whose balloon reports free pages to its host."""
    try:
        names = [e.name for e in os.scandir(devices) if e.name.startswith("virtio")]
    except OSError:
        return False
    for name in names:
        try:
            with open(os.path.join(devices, name, "features")) as f:
                bits = f.read().strip()
        except OSError:
            continue
        if len(bits) > FREE_PAGE_REPORTING_BIT and bits[FREE_PAGE_REPORTING_BIT] == "1":
            return True
    return False


def settings() -> dict[str, str]:
    """The variables NumPy is loaded under on this machine (see the module docstring)."""
    return dict([BLAS_THREADS, NO_HUGE_PAGES] if free_pages_reported() else [BLAS_THREADS])


def load_numpy() -> None:
    """Import NumPy under ``settings()``, each one only where the user has not set that variable,
    then put the environment back as it was. Nothing is done where NumPy is loaded already."""
    if "numpy" in sys.modules:
        return
    ours = {name: value for name, value in settings().items() if name not in os.environ}
    os.environ.update(ours)
    try:
        import numpy  # noqa: F401  (loaded here, under the settings)
    finally:
        for name in ours:
            del os.environ[name]
