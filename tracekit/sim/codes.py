"""Every integer code the simulator's compiled kernels share, as IntEnums.

numba reads IntEnum members as compile-time constants, so kernels write
``stats[Stat.OOMS]``, ``op[i] == Op.SEGMENT_ALLOC`` or ``cfg[TorchSetting.EXPANDABLE]``
and no slot, code or setting is ever a bare number. The groups:

- trace rows (``Op``, from the trace schema) and what a replay did with each
  input row (``Status``), the kernel-ready kind of a row (``Kind``);
- the int64 ``stats`` vector every policy returns (``Stat``);
- the free lists' placement rule (``Fit``) and scalar state (``HeapSlot``), the
  buddy allocator's scalar state (``BuddySlot``);
- the pool models' chunk store (``Piece`` states, ``Field`` columns of the chunk
  matrix, ``Slot`` counters, ``Row`` columns of emitted rows, ``Reservation``
  columns of PyTorch's expandable segments);
- named kernel settings (``TorchSetting``, ``CupySetting``): the settings
  vector a policy builds with ``named_vector`` and its kernel reads by name.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import IntEnum

import numpy as np

from tracekit.trace.schema import Op

# The treap's row widths (``tracekit.sim.treap`` takes them from here, so this module, and with it
# the policy registry, never imports numba): K1..PR without size augmentation, then SZ and MX.
TREE_FIELDS = 7
NFIELDS = 9


class Kind(IntEnum):
    """What a policy does with an input row."""

    ALLOC = 0  # malloc, or a recorded oom row replayed as an attempt
    FREE = 1
    OTHER = 2  # segment rows (the policy makes its own), ignored
    TRY = 3  # a recorded oom row the program survived: attempted; a failure is handled, a success
    #          is released at once (it lives no longer than the retry that replaced it)


class Status(IntEnum):
    """What happened to each input event during a replay."""

    IGNORED = 0  # not a user request (segment row), or after the replay stopped
    DONE = 1  # malloc (or a replayed oom row) placed, or free performed
    OOM = 2  # the request could not be placed: emitted as an ``oom`` row
    SKIPPED = 3  # a free whose malloc failed earlier (--continue-on-oom)
    TRIED = 4  # a handled request (``Kind.TRY``) the replay could serve: placed and released at once


class Stat(IntEnum):
    """Slots of ``PolicyRun.stats`` (int64). Bytes unless noted; -1 = not applicable."""

    PEAK_LIVE = 0  # max over time of the allocated (rounded) sizes of live blocks
    PEAK_RESERVED = 1  # max device memory held: segments for pools, heap high-water for lists
    PEAK_EXTENT = 2  # free lists: highest end address ever in use; pools: -1
    SEGMENT_ALLOCS = 3  # count of segment_alloc rows emitted
    SEGMENT_FREES = 4  # count of segment_free rows emitted
    OOMS = 5  # count of failed requests
    FIRST_OOM = 6  # input index of the first failed request, -1 if none
    OOM_FREE = 7  # at the first OOM: free bytes the policy held (reserved - live, or heap free)
    OOM_LARGEST = 8  # at the first OOM: largest free block usable for that request
    OOM_LIVE = 9  # at the first OOM: live bytes
    OOM_RESERVED = 10  # at the first OOM: reserved bytes
    OOM_ROUNDED = 11  # at the first OOM: the request after the policy's rounding
    HANDLED = 12  # count of handled requests (``Kind.TRY``) that failed again: the program went on
    # The most this run's limit tests were asked: for a run they refused nothing (ASKED <= its
    # capacity, or none), the capacity from which it is the run without a limit (at every capacity
    # >= ASKED, and at none, the same steps, other settings alike); -1: not known (a policy that
    # does not say, or one whose rules read the capacity elsewhere). PyTorch's model: the most
    # reserved + segment asked; CuPy's pool and the device models: ``tracekit.sim.limit_test``.
    ASKED = 13
    # The capacities at which this run itself replays step by step alike: every capacity c with
    # SAME_FROM <= c < SAME_BELOW; -1 (both): not known. PyTorch's model: the most reserved +
    # segment its limit test let through, and the least it refused (NO_REFUSAL: none refused).
    SAME_FROM = 14
    SAME_BELOW = 15


class Fit(IntEnum):
    """Placement rule of the address-ordered free list."""

    FIRST = 0
    BEST = 1
    NEXT = 2
    WORST = 3


class HeapSlot(IntEnum):
    """Scalar state of the free-list kernel (int64 vector), so a replay runs in chunks."""

    ROOT = 0  # root of the address- or size-keyed treap
    RECYCLE = 1  # head of the list of recycled node rows
    NEXT_ID = 2  # next never-used node row
    ROVER = 3  # next fit's roving pointer
    LIVE = 4  # bytes in use
    CAP = 5  # heap size
    FIT = 6  # a ``Fit``
    STOPPED = 7  # 1 once the replay stopped at an OOM
    GROWS = 8  # 1 for an unbounded heap (grows only when nothing below its top fits)
    TOP = 9  # where the free block running to the heap's end starts (CAP when there is none)
    ASKED = 10  # first and best fit: capacity from which the run is the unbounded one (``Stat.ASKED``)
    PASSED = 11  # the least capacity at which every placement so far is the same (``Stat.SAME_FROM``)
    REFUSED = 12  # the capacity from which one is not, 0 while none (``Stat.SAME_BELOW``)
    SAYS = 13  # 1: keep TOP and the three above (first and best fit, ``SimConfig.alike``)


class ListField(IntEnum):
    """Columns of the free-list kernel's node table after the treap's ``NFIELDS``."""

    ADDR = NFIELDS
    PREV = NFIELDS + 1  # address-ordered neighbours
    NEXT = NFIELDS + 2  # (also the recycled-row link)
    ISFREE = NFIELDS + 3


LIST_WIDTH = int(ListField.ISFREE) + 1


BUDDY_MAX_ORDER = 62  # the buddy allocator's largest block: 2**62 bytes


class BuddySlot(IntEnum):
    """Scalar state of the buddy kernel."""

    RECYCLE = 0
    NEXT_ID = 1
    LIVE = 2
    CAP = 3
    STOPPED = 4


class Piece(IntEnum):
    """State of one piece of pool memory in the chunk store."""

    FREE = 0  # mapped and cached: in the free tree
    USED = 1  # a live block
    UNMAPPED = 2  # reserved address space of an expandable segment: in the unmapped tree
    DEAD = 3  # a recycled row


class Tree(IntEnum):
    """The chunk store's two treaps; tree t's columns start at ``t * TREE_FIELDS``."""

    FREE = 0  # free mapped pieces, keyed (group, size, address)
    UNMAPPED = 1  # unmapped pieces of expandable segments, keyed (group, address)


class Field(IntEnum):
    """Columns of the chunk matrix ``C[piece, field]``.

    The first ``TREE_FIELDS`` columns are the free tree's treap fields: its key
    is (GROUP, SIZE, ADDR), so those three fields are the live key columns.
    The unmapped tree's fields follow (its key columns hold copies).
    """

    GROUP = 0  # a CuPy arena (pool, stream) or a PyTorch (pool, stream) pair
    SIZE = 1
    ADDR = 2
    PREV = 2 * TREE_FIELDS  # address-ordered neighbours inside one device allocation
    NEXT = 2 * TREE_FIELDS + 1
    STATE = 2 * TREE_FIELDS + 2  # a ``Piece``
    INW = 2 * TREE_FIELDS + 3  # 1 while on the list of free whole allocations
    WPREV = 2 * TREE_FIELDS + 4
    WNEXT = 2 * TREE_FIELDS + 5
    EXP = 2 * TREE_FIELDS + 6  # the expandable segment's group, -1 for a plain allocation
    HPREV = 2 * TREE_FIELDS + 7  # list of live device allocations (their first piece)
    HNEXT = 2 * TREE_FIELDS + 8
    SEGEND = 2 * TREE_FIELDS + 9  # end address of the device allocation (first piece)
    GCBASE = 2 * TREE_FIELDS + 10  # PyTorch's gc_count_base when the piece was cached
    RECYCLED = 2 * TREE_FIELDS + 11  # next recycled row, while DEAD


N_FIELDS = int(Field.RECYCLED) + 1


class Slot(IntEnum):
    """Counters and list heads of the chunk store (int64 vector ``S``)."""

    ROOT_FREE = 0
    ROOT_UNMAPPED = 1
    HW = 2  # rows ever used (high-water)
    FREELIST = 3  # head of recycled rows
    NALIVE = 4  # rows alive
    WHEAD = 5  # head of the free-whole-allocation list
    NROWS = 6  # rows emitted
    LIVE = 7  # bytes in live blocks
    RESERVED = 8  # bytes of mapped device allocations
    PEAK_LIVE = 9
    PEAK_RES = 10
    NEXT_ADDR = 11  # next invented device address
    DEV_USED = 12  # device bytes at the driver's granularity
    SEGA = 13  # segment_alloc rows emitted
    SEGF = 14  # segment_free rows emitted
    HHEAD = 15  # head of the live device allocation list
    GCL = 16  # PyTorch's get_free_blocks_call_count of the large pool
    ASKED = 17  # the most reserved + segment bytes a device allocation asked for (``Stat.ASKED``)
    PASSED = 18  # the most of those the limit test let through (``Stat.SAME_FROM``)
    REFUSED = 19  # the least of those the limit test refused, 0 while none was (``Stat.SAME_BELOW``)


N_SLOTS = int(Slot.REFUSED) + 1
NO_REFUSAL = 1 << 62  # ``Stat.SAME_BELOW`` of a run whose limit test refused nothing: no capacity above


class Row(IntEnum):
    """Columns of an emitted allocator row ``R[k]``."""

    BEFORE = 0  # input index the row is inserted before
    OP = 1  # an ``Op``
    ADDR = 2
    SIZE = 3
    STREAM = 4


N_ROW = int(Row.STREAM) + 1


class Reservation(IntEnum):
    """Columns of PyTorch's expandable-segment table ``X[group]``."""

    BASE = 0  # the segment's base address
    PAGE = 1  # mapping granularity (2 MiB small pool, 20 MiB large)
    MADE = 2  # a ``Reserve``
    VSIZE = 3  # reserved virtual bytes


class Hint(IntEnum):
    """Rows of the recorded device allocations a pool replay reuses (``hints[Hint, k]``)."""

    BEFORE = 0  # the input index of the request the recorded segment_alloc precedes
    ADDR = 1
    SIZE = 2
    TAKEN = 3  # 1 once a replayed device allocation took this address


class Reserve(IntEnum):
    """Whether an expandable segment's address range is reserved (``X[group, Reservation.MADE]``)."""

    NONE = 0  # not yet: reserved on first use
    DONE = 1
    AT_BASE = 2  # to be reserved at ``Reservation.BASE`` (a recorded starting state)


class TorchPool(IntEnum):
    """PyTorch's two pools; a torch group is ``pool * streams + stream index``."""

    LARGE = 0
    SMALL = 1  # requests of at most 1 MiB, in 2 MiB segments


class TorchSetting(IntEnum):
    """The ``torch`` kernel's settings vector (bytes unless noted; 0 = none)."""

    CAPACITY = 0  # per-process limit
    DEVICE_TOTAL = 1
    MAX_SPLIT = 2  # max_split_size (NO_SPLIT_LIMIT when unset)
    MAX_NON_SPLIT = 3  # max_non_split_rounding
    EXPANDABLE = 4  # 1 with expandable segments
    GC_THRESHOLD = 5  # garbage-collection threshold in bytes, 0 = off
    STREAMS = 6  # number of distinct streams (groups per pool)
    CONTINUE = 7  # 1: go on after an OOM


class CupySetting(IntEnum):
    """The ``cupy`` kernel's settings vector."""

    LIMIT = 0  # set_limit bytes, 0 = none
    DEVICE_TOTAL = 1
    CONTINUE = 2
    TIES = 3  # 1: among equal-size best fits, follow the recorded choice


def named_vector(enum: type[IntEnum], values: Mapping[IntEnum, int]) -> np.ndarray:
    """The int64 settings vector of ``enum`` with every member given a value by name."""
    missing = [m.name for m in enum if m not in values]
    if missing:
        raise ValueError(f"{enum.__name__}: no value for {', '.join(missing)}")
    out = np.zeros(len(enum), np.int64)
    for member, value in values.items():
        out[member] = int(value)
    return out


__all__ = [
    "LIST_WIDTH", "NO_REFUSAL", "N_FIELDS", "N_ROW", "N_SLOTS",
    "BuddySlot", "CupySetting", "Field", "Fit", "HeapSlot",
    "Hint", "Kind", "ListField", "Op", "Piece", "Reservation", "Reserve", "Row", "Slot", "Stat", "Status",
    "TorchPool", "TorchSetting", "Tree", "named_vector",
]
