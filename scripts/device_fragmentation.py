"""Does the device itself fragment? Fill it, free every other block, ask for more than any hole.

Part 1 (the device, raw cudaMalloc): allocate ``--block`` bytes at a time
until the device is full, free every other block, then request blocks 2x, 4x,
8x the block size and 90% of the free memory, each freed right away. If device
memory were one contiguous address range managed by a free list, no request
larger than a block could succeed.

Part 2 (a CuPy MemoryPool over cudaMalloc, for contrast): fill the pool with
blocks, free them all into the pool's cache, then split every cached block by
asking for half a block plus 512 B (best fit takes a whole cached block for
each; CuPy never releases a split block while a piece is live), and ask for
2 blocks: the pool holds about half its memory free yet cannot serve it.

Everything is released at the end. Prints and (with ``--json``) writes the figures.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

GiB = 1 << 30


def _device_part(rt, block: int) -> dict:
    ptrs = []
    t0 = time.perf_counter()
    while True:
        try:
            ptrs.append(rt.malloc(block))
        except rt.CUDARuntimeError:
            break
    fill_s = time.perf_counter() - t0
    free_full = int(rt.memGetInfo()[0])
    kept = ptrs[1::2]
    for p in ptrs[0::2]:
        rt.free(p)
    free_holes = int(rt.memGetInfo()[0])
    requests = []
    for size in (2 * block, 4 * block, 8 * block, int(0.9 * free_holes)):
        try:
            p = rt.malloc(size)
            ok = True
            rt.free(p)
        except rt.CUDARuntimeError:
            ok = False
        requests.append({"size": size, "times_block": round(size / block, 3), "ok": ok,
                         "larger_than_any_hole": size > block})
    for p in kept:
        rt.free(p)
    return {"block": block, "blocks_filled": len(ptrs), "fill_seconds": round(fill_s, 3),
            "free_when_full": free_full, "blocks_freed": len(ptrs[0::2]), "blocks_kept": len(kept),
            "free_with_holes": free_holes, "requests": requests, "free_after": int(rt.memGetInfo()[0])}


def _pool_part(cupy, block: int) -> dict:
    from cupy.cuda import memory

    rt = cupy.cuda.runtime
    pool = memory.MemoryPool()
    ptrs = []
    while True:
        try:
            ptrs.append(pool.malloc(block))
        except memory.OutOfMemoryError:
            break
    n = len(ptrs)
    ptrs.clear()  # all back into the pool's cache; the device memory stays with the pool
    halves = []
    for _ in range(n):
        halves.append(pool.malloc(block // 2 + 512))
    state = {"pool_total": int(pool.total_bytes()), "pool_used": int(pool.used_bytes()),
             "pool_free": int(pool.free_bytes()), "device_free": int(rt.memGetInfo()[0])}
    try:
        p = pool.malloc(2 * block)
        ok = True
        del p
    except memory.OutOfMemoryError:
        ok = False
    halves.clear()
    pool.free_all_blocks()
    return {"block": block, "blocks_filled": n, "split_requests": n, "split_size": block // 2 + 512,
            **state, "request": 2 * block, "request_ok": ok, "free_after": int(rt.memGetInfo()[0])}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--block", type=float, default=4.0, help="block size in GiB (default 4)")
    ap.add_argument("--json", default=None, help="write the results here")
    a = ap.parse_args()
    import cupy

    rt = cupy.cuda.runtime
    block = int(a.block * GiB)
    with cupy.cuda.Device(a.device):
        start = int(rt.memGetInfo()[0])
        props = rt.getDeviceProperties(a.device)
        res = {"device": a.device, "name": props["name"].decode() if isinstance(props["name"], bytes)
               else str(props["name"]), "driver": rt.driverGetVersion(), "runtime": rt.runtimeGetVersion(),
               "cupy": cupy.__version__, "free_start": start,
               "device_level": _device_part(rt, block), "pool_level": _pool_part(cupy, block)}
        res["free_end"] = int(rt.memGetInfo()[0])
    d, p = res["device_level"], res["pool_level"]
    print(f"{res['name']} (driver {res['driver']}, runtime {res['runtime']}, CuPy {res['cupy']})")
    print(f"device: {d['blocks_filled']} x {a.block:g} GiB filled, every other freed "
          f"({d['free_with_holes'] / GiB:.2f} GiB free in holes of {a.block:g} GiB):")
    for r in d["requests"]:
        print(f"  request {r['size'] / GiB:7.2f} GiB ({r['times_block']}x block): "
              f"{'succeeded' if r['ok'] else 'FAILED'}")
    print(f"CuPy pool: {p['blocks_filled']} blocks, each split by a {p['split_size']:,} B request; "
          f"pool holds {p['pool_free'] / GiB:.2f} GiB free, device {p['device_free'] / GiB:.2f} GiB free; "
          f"request {p['request'] / GiB:.0f} GiB: {'succeeded' if p['request_ok'] else 'FAILED'}")
    print(f"released: free memory {res['free_start']:,} -> {res['free_end']:,}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=2)
    return 0 if res["free_end"] == res["free_start"] else 1


if __name__ == "__main__":
    sys.exit(main())
