"""The launcher's view of a recorded process, and one output name per rank.

Multi-process launchers tell each process who it is through the
environment: torchrun (and Horovod, DeepSpeed, Lightning) set ``RANK``,
``LOCAL_RANK`` and ``WORLD_SIZE``; Open MPI sets ``OMPI_COMM_WORLD_RANK``,
``OMPI_COMM_WORLD_LOCAL_RANK`` and ``OMPI_COMM_WORLD_SIZE``; MPICH and Intel
MPI set ``PMI_RANK``, ``PMI_SIZE`` (and ``MPI_LOCALRANKID``). ``Launch`` reads
the first family present. ``output_path`` expands ``{rank}``,
``{local_rank}``, ``{world_size}``, ``{host}`` and ``{pid}`` in an output path
(a process outside any launcher is rank 0 of 1), and when a launcher is
present and the path has no placeholder it puts ``.rank<N>`` before the
suffix (``ddp.parquet`` -> ``ddp.rank1.parquet``), so two ranks never write
one file. ``Launch.from_meta`` reads the same fields back from a trace's
``launch`` metadata (what ``to_dict`` wrote), for the tools that read traces.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tracekit.inputs import optional_int

FAMILIES = (
    ("RANK", "LOCAL_RANK", "WORLD_SIZE"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_SIZE"),
    ("PMI_RANK", "MPI_LOCALRANKID", "PMI_SIZE"),
)
PLACEHOLDERS = ("{rank}", "{local_rank}", "{world_size}", "{host}", "{pid}")


def _meta_int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


@dataclass(frozen=True)
class Launch:
    """Rank, local rank and world size (None outside a launcher), host name and pid (None = unknown)."""

    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None
    host: str | None = None
    pid: int | None = None
    launcher: str | None = None  # the variable family found, e.g. "RANK"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Launch:
        env = os.environ if env is None else env
        host, pid = platform.node(), os.getpid()
        for rank_var, local_var, size_var in FAMILIES:
            if rank_var in env or local_var in env:
                return cls(optional_int(env.get(rank_var)), optional_int(env.get(local_var)),
                           optional_int(env.get(size_var)), host, pid,
                           rank_var if rank_var in env else local_var)
        return cls(None, None, None, host, pid)

    @classmethod
    def from_meta(cls, meta: Mapping[str, Any] | None) -> Launch:
        """From a trace's ``launch`` metadata object; a field missing or of the wrong type is None."""
        d = meta if isinstance(meta, Mapping) else {}
        host, launcher = d.get("host"), d.get("launcher")
        return cls(_meta_int(d.get("rank")), _meta_int(d.get("local_rank")), _meta_int(d.get("world_size")),
                   host if isinstance(host, str) else None, _meta_int(d.get("pid")),
                   launcher if isinstance(launcher, str) else None)

    @property
    def launched(self) -> bool:
        return self.rank is not None or self.local_rank is not None

    def to_dict(self, device: int | None = None) -> dict[str, Any]:
        """The ``launch`` metadata object (``device``: the CUDA ordinal the recording started on)."""
        return {"rank": self.rank, "local_rank": self.local_rank, "world_size": self.world_size,
                "host": self.host, "pid": self.pid, "launcher": self.launcher, "device": device,
                "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}


def output_path(path: Path, launch: Launch) -> Path:
    """``path`` with its placeholders filled, or with ``.rank<N>`` added under a launcher."""
    text = str(path)
    if any(p in text for p in PLACEHOLDERS):
        values = {"{rank}": launch.rank if launch.rank is not None else (launch.local_rank or 0),
                  "{local_rank}": launch.local_rank if launch.local_rank is not None else 0,
                  "{world_size}": launch.world_size if launch.world_size is not None else 1,
                  "{host}": launch.host, "{pid}": launch.pid}
        for key, value in values.items():
            text = text.replace(key, str(value))
        return Path(text)
    if not launch.launched:
        return path
    tag = f"rank{launch.rank}" if launch.rank is not None else f"local{launch.local_rank}"
    if path.suffix:
        return path.with_name(f"{path.stem}.{tag}{path.suffix}")
    return path.with_name(f"{path.name}.{tag}")
