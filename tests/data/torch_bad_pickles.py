"""Regenerates the bad snapshot fixtures next to this file: python tests/data/torch_bad_pickles.py.

- torch_malicious.pickle / torch_malicious_p0.pickle: would run ``os.system("touch
  tracekit_pickle_ran")`` if unpickled with plain ``pickle.load`` (protocol 4 and 0);
- torch_corrupt.pickle: a valid snapshot with bytes overwritten in the middle;
- torch_truncated.pickle: a valid snapshot cut in half;
- torch_corrupt.pickle.gz / torch_truncated.pickle.gz: the same faults in a gzip stream.
"""

from __future__ import annotations

import gzip
import os
import pickle
from pathlib import Path

HERE = Path(__file__).resolve().parent


class _Evil:
    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (os.system, ("touch tracekit_pickle_ran",))


def good() -> bytes:
    hist = [{"action": "alloc", "addr": 0x7F0000000000 + 512 * i, "size": 512, "stream": 0,
             "time_us": 1000 + i, "frames": [{"filename": "x.py", "line": i, "name": "f"}]}
            for i in range(200)]
    return pickle.dumps({"segments": [], "device_traces": [hist]}, protocol=4)


def main() -> None:
    evil = {"segments": [], "device_traces": [[_Evil()]]}
    (HERE / "torch_malicious.pickle").write_bytes(pickle.dumps(evil, protocol=4))
    (HERE / "torch_malicious_p0.pickle").write_bytes(pickle.dumps(evil, protocol=0))
    data = good()
    mid = len(data) // 2
    corrupt = data[:mid] + b"\xff" * 16 + data[mid + 16:]
    (HERE / "torch_corrupt.pickle").write_bytes(corrupt)
    (HERE / "torch_truncated.pickle").write_bytes(data[:mid])
    gz = gzip.compress(data, mtime=0)
    gmid = len(gz) // 2
    (HERE / "torch_corrupt.pickle.gz").write_bytes(gz[:gmid] + bytes(b ^ 0x5A for b in gz[gmid:gmid + 8])
                                                   + gz[gmid + 8:])
    (HERE / "torch_truncated.pickle.gz").write_bytes(gz[:gmid])


if __name__ == "__main__":
    main()
