"""Importers: other tools' allocation histories turned into v1 traces.

``torch_snapshot.import_snapshot`` reads a PyTorch CUDA memory snapshot (the
pickle ``torch.cuda.memory._dump_snapshot`` writes) with a restricted unpickler
(``safe_pickle``), maps its history to v1 rows (``torch_columns``), rebuilds the
state before a wrapped history (``torch_state``) and writes the trace.
``torch_record.record_torch`` records a PyTorch program and imports its snapshot.
Nothing here imports PyTorch except ``record_torch`` when it runs.
"""

from tracekit.importers.torch_snapshot import ImportResult, import_snapshot

__all__ = ["ImportResult", "import_snapshot"]
