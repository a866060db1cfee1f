"""Running live and reserved bytes must stay below 2^62 (tracekit.trace.totals), worked by hand."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tracekit.errors import TraceFormatError
from tracekit.trace import Events, Op, Source, TraceMeta, read_trace, write_trace

E60 = 1 << 60
SA, SF = Op.SEGMENT_ALLOC, Op.SEGMENT_FREE


def _segments(tmp_path: Path, ops: list[Op], slots: list[int]) -> Path:
    ev = Events.build(np.array(ops, np.int8), np.full(len(ops), E60, np.uint64),
                      addr=np.array(slots, np.uint64) << np.uint64(61))
    return write_trace(tmp_path / "t.parquet", TraceMeta.new(Source.SYNTHETIC), ev)


def test_frees_count_against_the_total(tmp_path: Path) -> None:
    # 3 x 2^60 reserved, two freed (2^60), two more: 3 x 2^60 at most, below 2^62
    p = _segments(tmp_path, [SA, SA, SA, SF, SF, SA, SA], [0, 1, 2, 0, 1, 3, 4])
    assert len(read_trace(p).events) == 7


def test_reserved_bytes_reaching_2_62_are_refused_at_that_event(tmp_path: Path) -> None:
    # 3 x 2^60, one freed (2 x 2^60), then 2^60 more twice: 4 x 2^60 = 2^62 at seq 5
    p = _segments(tmp_path, [SA, SA, SA, SF, SA, SA], [0, 1, 2, 0, 3, 4])
    with pytest.raises(TraceFormatError, match=r"reserved bytes reach 2\^62 or more at seq 5"):
        read_trace(p)

