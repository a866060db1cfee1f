"""Regenerate the small invalid trace files under tests/data/ used by the format tests.

Each file breaks exactly one rule of trace format v1; tests/cli/test_trace_format.py
asserts the exact error sentence for each. Run: python3 scripts/make_bad_traces.py
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

OUT = Path(__file__).resolve().parent.parent / "tests" / "data"
META = {"schema_version": 1, "source": "synthetic"}


def table(**over: object) -> dict[str, pa.Array]:
    cols: dict[str, pa.Array] = {
        "seq": pa.array([0, 1, 2], pa.uint64()),
        "t_ns": pa.array([0, 10, 20], pa.int64()),
        "op": pa.array(["malloc", "malloc", "free"]).dictionary_encode(),
        "addr": pa.array([4096, 8192, 4096], pa.uint64()),
        "size": pa.array([100, 600, 512], pa.uint64()),
        "rounded": pa.array([512, 1024, None], pa.uint64()),
        "stream": pa.array([0, 0, 0], pa.uint64()),
        "device": pa.array([0, 0, 0], pa.int16()),
        "site": pa.array(["a.py:1:f", None, None]).dictionary_encode(),
    }
    for k, v in over.items():
        if v is None:
            cols.pop(k)
        else:
            cols[k] = v  # type: ignore[assignment]
    return cols


def write(name: str, cols: dict[str, pa.Array], meta: dict | None = META) -> None:
    t = pa.table(cols)
    if meta is not None:
        t = t.replace_schema_metadata({b"tracekit": json.dumps(meta).encode()})
    pq.write_table(t, OUT / name)


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    write("valid_small.parquet", table())
    write("missing_column.parquet", table(size=None))
    write("wrong_type.parquet", table(size=pa.array(["100", "600", "512"])))
    write("seq_not_increasing.parquet", table(seq=pa.array([0, 2, 2], pa.uint64())))
    write("t_ns_decreasing.parquet", table(t_ns=pa.array([0, 10, 5], pa.int64())))
    write("unknown_op.parquet", table(op=pa.array(["malloc", "calloc", "free"])))
    write("missing_size.parquet", table(size=pa.array([100, None, 512], pa.uint64())))
    write("missing_addr.parquet", table(addr=pa.array([4096, None, 4096], pa.uint64())))
    write("bad_version.parquet", table(), {"schema_version": 3, "source": "cupy"})
    write("bad_source.parquet", table(), {"schema_version": 1, "source": "tensorflow"})
    write("no_metadata.parquet", table(), None)
    write("huge_size.parquet", table(size=pa.array([100, 2**63 + 5, 512], pa.uint64())))
    write("device_out_of_range.parquet", table(device=pa.array([0, 70000, 0], pa.int32())))
    write("bad_meta_value.parquet", table(), {"schema_version": 1, "source": "cupy",
                                              "pool_limit_bytes": "4GiB"})
    write("bad_meta_versions.parquet", table(), {"schema_version": 1, "source": "cupy",
                                                 "versions": [1, 2]})
    ops = ["malloc", "free", "free", "free", "malloc", "malloc"]
    write("inconsistent.parquet", table(
        seq=pa.array(range(6), pa.uint64()), t_ns=pa.array(range(6), pa.int64()),
        op=pa.array(ops).dictionary_encode(),
        addr=pa.array([4096, 4096, 4096, 9999, 8192, 8192], pa.uint64()),
        size=pa.array([100, 512, 512, 512, 50, 50], pa.uint64()),
        rounded=pa.array([512, None, None, None, 512, 512], pa.uint64()),
        stream=pa.array([0] * 6, pa.uint64()), device=pa.array([0] * 6, pa.int16()),
        site=pa.array([None] * 6, pa.string()).dictionary_encode(),
    ))
    (OUT / "empty.parquet").write_bytes(b"")
    (OUT / "not_parquet.parquet").write_text("seq,t_ns,op\n0,0,malloc\n")
    whole = (OUT / "valid_small.parquet").read_bytes()
    (OUT / "truncated.parquet").write_bytes(whole[: len(whole) // 2])


if __name__ == "__main__":
    main()
