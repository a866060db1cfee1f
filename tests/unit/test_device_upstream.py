"""``device.allocators.Upstream`` through ``ObservedPool`` over the CuPy stand-in (``tests/fakecupy``).

The device replay's pools (CuPy's ``ObservedPool``, RMM's ``RmmPool``) count and log every device
allocation their pool makes through ``Upstream``. Here CuPy's pool is the stand-in's (CuPy 14.2's
rounding to 512 B and its arena reuse), run in a child process so the stand-in never becomes this
process's ``cupy``: two requests that take two device allocations, one freed and served again from
the pool, then the cleanup, which is not recorded. The real pools on a GPU:
``tests/gpu/test_device_gpu.py`` and ``tests/gpu/test_device_rmm_gpu.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

FAKE = Path(__file__).resolve().parents[1] / "fakecupy"

CHILD = """
import json
from tracekit.device.allocators import ObservedPool, SegmentLog

log = SegmentLog()
pool = ObservedPool(log, None)
pool.current = 0
a = pool.pool.malloc(1000)            # 1,024 B rounded: one device allocation
pool.current = 1
b = pool.pool.malloc(3 << 20)         # 3 MiB: another
peak = pool.peak_reserved
pool.current = 2
del a                                  # back to the pool: no device call
pool.current = 3
c = pool.pool.malloc(900)              # served from the pool
del b, c
pool.release()                         # the cleanup: given back, not recorded
print(json.dumps({"before": log.before, "op": log.op, "size": log.size, "peak": peak,
                  "reserved": pool.reserved, "lat_ok": all(x >= 0 for x in log.latency)}))
"""


def test_the_pools_device_allocations_are_counted_and_logged_once() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(FAKE), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, timeout=120,
                         cwd=Path(__file__).resolve().parents[2], check=True)
    got = json.loads(out.stdout)
    from tracekit.trace.schema import Op

    assert got["op"] == [int(Op.SEGMENT_ALLOC), int(Op.SEGMENT_ALLOC)]
    assert got["before"] == [0, 1]  # each row lands before the request that made it
    assert got["size"][1] == 3 << 20 and got["size"][0] >= 1024
    assert got["peak"] == sum(got["size"])
    assert got["reserved"] == 0  # the cleanup gave every byte back, and was not logged
    assert got["lat_ok"]
