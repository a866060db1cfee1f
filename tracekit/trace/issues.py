"""The kinds of event-level inconsistency a reader finds (``tracekit.trace.validate``), and their counts;
the faults its one compiled pass looks for (``Found``) and the slots of that pass's state (``PassState``).

Apart from the pairing itself so that its compiled kernels (``tracekit.trace._kernels``) can name
them without importing the module that loads them.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum


class IssueKind(IntEnum):
    FREE_NOT_LIVE = 0
    DOUBLE_FREE = 1
    MALLOC_LIVE = 2
    SEGMENT_FREE_NOT_LIVE = 3
    SEGMENT_DOUBLE_FREE = 4
    SEGMENT_ALLOC_LIVE = 5
    FREE_OTHER_DEVICE = 6
    BLOCK_OTHER_DEVICE = 7
    BLOCK_OUTSIDE_SEGMENT = 8
    SEGMENT_FREE_UNDER_BLOCKS = 9
    ROUNDED_BELOW_SIZE = 10

    @property
    def describe(self) -> str:
        return _DESCRIBE[self]

    @property
    def severity(self) -> Severity:
        return Severity.WARNING if self >= IssueKind.BLOCK_OUTSIDE_SEGMENT else Severity.SKIPPED


class Found(IntEnum):
    """Slots of the reader's one compiled pass (``_kernels.read_pass``): the index of the first event
    with each fault, -1 for none. The reader raises them in the order of its checks, not this one."""

    SEQ_BACK = 0  # seq not above the row before
    T_BACK = 1  # t_ns below the row before
    BIG_REQUEST = 2  # a malloc or oom of 2^60 bytes or more
    OVER_LIVE = 3  # live bytes of the kept events reach 2^62
    OVER_RESERVED = 4  # reserved bytes of the kept events reach 2^62
    PAST_END = 5  # a kept block or segment runs past the end of the 64-bit address space


class PassState(IntEnum):
    """Slots of the reader's pass's scalar state (int64), kept between its calls (``_kernels.
    pass_until_full``, and the same pass compiled ahead of time, ``_readpass``): the numba pass stops
    where its table of live allocations must grow (``live_table.grow`` makes arrays, which a ``plain``
    kernel may not), and both are handed the rows read so far, a window at a time."""

    AT = 0  # the next event to read
    USED = 1  # live allocations in the table
    UNPAIRED = 2  # frees of no live allocation so far: counted by kind after the pass
    LIVE_BYTES = 3  # the rounded sizes of the live blocks kept (bytes)
    RESERVED = 4  # the sizes of the live segments kept (bytes)
    COUNTING = 5  # 1 until the totals' first step past the limit (they are exact up to it)


class Severity(IntEnum):
    """SKIPPED: readers drop the events; WARNING: they keep them (the data may be real)."""

    SKIPPED = 0
    WARNING = 1


_DESCRIBE = {
    IssueKind.FREE_NOT_LIVE: "free of an address that is not live",
    IssueKind.DOUBLE_FREE: "double free",
    IssueKind.MALLOC_LIVE: "malloc of an address that is already live",
    IssueKind.SEGMENT_FREE_NOT_LIVE: "segment_free of a segment that is not live",
    IssueKind.SEGMENT_DOUBLE_FREE: "segment freed twice",
    IssueKind.SEGMENT_ALLOC_LIVE: "segment_alloc of an address that is already live",
    IssueKind.FREE_OTHER_DEVICE: "free on another device than its malloc (devices contradict each other)",
    IssueKind.BLOCK_OTHER_DEVICE: "malloc inside a segment of another device, none of its own (and its free)",
    IssueKind.BLOCK_OUTSIDE_SEGMENT: "malloc outside any live segment of its device",
    IssueKind.SEGMENT_FREE_UNDER_BLOCKS: "segment_free while blocks inside it are live",
    IssueKind.ROUNDED_BELOW_SIZE: "malloc with rounded below size",
}


@dataclass(frozen=True)
class EventIssue:
    """One kind of inconsistency: how many events had it, and the first one's seq."""

    kind: IssueKind
    count: int
    first_seq: int

    def describe(self) -> str:
        return f"{self.count} x {self.kind.describe} (first at seq {self.first_seq})"
