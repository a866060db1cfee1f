"""The table of live allocations that pairs frees with their mallocs, compiled (numba).

Open addressing over (key, tag) slots with linear probing. A key is an address; a tag is
``(device mod 2^16) · N_CLASSES + class`` (``BLOCK`` or ``SEGMENT``, ``tag_of``), so blocks and
segments of one address, and one address on two devices, are separate keys; a slot's value is the
row of the live allocation. A free empties its slot (``remove``: the probe run after it shifted back, no
tombstones), so the table holds the live allocations only: a few thousand where a trace has
millions of blocks at addresses of their own, and it stays in the cache. Used by the reader's pass
(``tracekit.trace._kernels.read_pass``) and by a replay begun during the read
(``tracekit.sim._head_kernel``).

Apart from ``_kernels`` so that the simulator calls it without another package's private names; a
caller imports it only where it needs numba anyway.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from tracekit.compiled import plain

EMPTY = -1  # the tag of an unused slot (tags are never negative: ``tag_of``)
BLOCK, SEGMENT, N_CLASSES = 0, 1, 2
INITIAL_SLOTS = 1 << 12  # a power of two: the slot index is the hash masked by slots − 1
# Fibonacci hashing: h = ((addr >> ADDR_SHIFT) · ⌊2^64/φ⌋ mod 2^64) >> HASH_SHIFT. Device
# allocations are at least 256-byte aligned, so the low ADDR_SHIFT bits carry nothing; the
# product's high bits mix best, so the low HASH_SHIFT are dropped.
GOLDEN = 11400714819323198485  # ⌊2^64 / φ⌋
ADDR_SHIFT = 8
HASH_SHIFT = 20


@njit(cache=True)
def new_table():  # pragma: no cover - compiled
    """An empty table of INITIAL_SLOTS slots: (keys, tags, values)."""
    return (np.zeros(INITIAL_SLOTS, np.uint64), np.full(INITIAL_SLOTS, EMPTY, np.int32),
            np.zeros(INITIAL_SLOTS, np.int64))


@plain(inline="always")
def tag_of(device, seg):  # pragma: no cover - compiled
    """The tag of an allocation of ``device``: a segment's (``seg``) or a block's. The device's 16 bits
    as an unsigned number, so that no device (-1 included) makes a tag of EMPTY."""
    return (np.int32(device) & np.int32(0xFFFF)) * N_CLASSES + (SEGMENT if seg else BLOCK)


@plain
def home(addr, mask):  # pragma: no cover - compiled
    """The first slot of an address's probe run."""
    h = ((addr >> np.uint64(ADDR_SHIFT)) * np.uint64(GOLDEN)) >> np.uint64(HASH_SHIFT)
    return np.int64(h & np.uint64(mask))


@plain
def slot(keys, tags, addr, tag, mask):  # pragma: no cover - compiled
    """The slot of (addr, tag): where it is, or the empty slot where it goes (linear probing
    from its home slot)."""
    j = home(addr, mask)
    while tags[j] != EMPTY and (keys[j] != addr or tags[j] != tag):
        j = (j + 1) & mask
    return j


@plain
def remove(keys, tags, vals, j, mask):  # pragma: no cover - compiled
    """Empty slot j, moving back each later slot of its probe run that may take the place (linear
    probing's deletion without tombstones: every key stays reachable from its home slot)."""
    k = j
    while True:
        k = (k + 1) & mask
        if tags[k] == EMPTY:
            break
        h = home(keys[k], mask)
        if (j <= k and (h <= j or h > k)) or (j > k and h <= j and h > k):
            keys[j] = keys[k]
            tags[j] = tags[k]
            vals[j] = vals[k]
            j = k
    tags[j] = EMPTY


@plain
def too_full(used, slots):  # pragma: no cover - compiled
    """Load factor used / slots above 1/2: probe runs would grow long."""
    return used * 2 > slots


@njit(cache=True)
def grow(keys, tags, vals):  # pragma: no cover - compiled
    """The table rehashed into twice the slots."""
    cap = keys.shape[0] * 2
    nk = np.zeros(cap, np.uint64)
    nt = np.full(cap, EMPTY, np.int32)
    nv = np.zeros(cap, np.int64)
    for j in range(keys.shape[0]):
        if tags[j] != EMPTY:
            k = slot(nk, nt, keys[j], tags[j], cap - 1)
            nk[k] = keys[j]
            nt[k] = tags[j]
            nv[k] = vals[j]
    return nk, nt, nv
