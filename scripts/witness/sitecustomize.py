"""A witness beside tracekit in every process of ``scripts/gpu_real_advice.py``: PyTorch's own counters.

With ``TRACEKIT_WITNESS`` naming a file, a process that imported torch appends one JSON line at
exit: its arguments, ``PYTORCH_CUDA_ALLOC_CONF``, ``torch.cuda.max_memory_reserved()``,
``max_memory_allocated()`` and ``memory_stats()['num_ooms']``. Nothing else is done.
"""

import atexit
import json
import os
import sys


def _witness() -> None:
    path = os.environ.get("TRACEKIT_WITNESS")
    torch = sys.modules.get("torch")
    if not path or torch is None or not torch.cuda.is_initialized():
        return
    stats = torch.cuda.memory_stats()
    line = {"argv": sys.argv, "conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
            "max_reserved": torch.cuda.max_memory_reserved(),
            "max_allocated": torch.cuda.max_memory_allocated(),
            "num_ooms": stats.get("num_ooms", 0)}
    with open(path, "a") as fh:
        fh.write(json.dumps(line) + "\n")


if os.environ.get("TRACEKIT_WITNESS"):
    atexit.register(_witness)
