
import json, sys
import cupy as cp
import numpy as np
import rmm, rmm.mr
from rmm.allocators.cupy import rmm_cupy_allocator

rmm.reinitialize(pool_allocator=True, initial_pool_size=0, maximum_pool_size=536870912)
stats = rmm.mr.StatisticsResourceAdaptor(rmm.mr.get_current_device_resource())
rmm.mr.set_current_device_resource(stats)
cp.cuda.set_allocator(rmm_cupy_allocator)
rng = np.random.default_rng(0)
total = 0.0
for step in range(60):  # sizes of 4 KiB .. 32 MiB, some kept a while
    n = int(2 ** rng.uniform(10, 23))
    a = cp.random.random(n, dtype=cp.float32)
    b = cp.sort(a * 2)
    total += float(b[-1])
kept, failed = [], False
try:
    while True:  # until the pool's maximum: RMM raises MemoryError
        kept.append(cp.empty(48 * (1 << 20), cp.uint8))
except MemoryError:
    failed = True
n_kept = len(kept)
del kept
s = stats.allocation_counts
json.dump({"total_count": s.total_count, "total_bytes": s.total_bytes, "peak_bytes": s.peak_bytes,
           "failed": failed, "kept": n_kept,
           "logging_on_top": type(rmm.mr.get_current_device_resource()).__name__},
          open(sys.argv[1], "w"))
