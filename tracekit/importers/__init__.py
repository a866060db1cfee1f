"""Importers: other tools' allocation histories turned into v1 traces.

``torch_snapshot.import_snapshot`` reads a PyTorch CUDA memory snapshot (the
pickle ``torch.cuda.memory._dump_snapshot`` writes) with a restricted unpickler
(``safe_pickle``) or a compiled scanner (``pickle_scan``, ``pickle_kernel``),
maps its history to v1 rows (``torch_columns``) and its frames to whole stacks
(``torch_stacks``), rebuilds the state before a wrapped history
(``torch_state``) and writes the trace.
Recording a PyTorch program is ``tracekit.record.torch``'s; nothing here imports PyTorch.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tracekit.importers.torch_snapshot import ImportResult, import_snapshot

__all__ = ["ImportResult", "import_snapshot"]


def __getattr__(name: str) -> Any:
    """Loaded on first use: ``record --torch`` imports this package into the recorded program's
    process (after it ends), which must not get the importer's numba kernels before it runs."""
    if name not in __all__:
        raise AttributeError(f"module 'tracekit.importers' has no attribute {name!r}")
    from tracekit.importers import torch_snapshot

    return getattr(torch_snapshot, name)
