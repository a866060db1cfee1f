"""``record --torch`` cuts the launcher's frames from the outer end of every stack, however it was started."""

from __future__ import annotations

import numpy as np

from tracekit.record.torch_trace import launcher_frames
from tracekit.trace.stacks import FrameKind, StackTable, trim_outer

LIB, USER = int(FrameKind.LIBRARY), int(FrameKind.USER)


def chain(files: list[str]) -> StackTable:
    """One stack per prefix of ``files`` (outermost first): stack i is files[i] called from stack i-1."""
    n = len(files)
    kinds = [USER if f.startswith("train") else LIB for f in files]
    parents = [-1, *range(n - 1)]
    return StackTable.build(files, list(range(1, n + 1)), ["f"] * n, kinds, list(range(n)), parents)


def test_console_script_and_module_starts_are_both_cut_and_the_programs_own_typer_kept() -> None:
    for entry in (["/venv/bin/tracekit"], ["<frozen runpy>", "<frozen runpy>", "tracekit/__main__.py"]):
        files = [*entry, "typer/main.py", "click/core.py", "tracekit/cli/record.py", "<frozen runpy>",
                 "train.py", "typer/main.py", "torch/nn/modules/module.py"]
        table = chain(files)
        trimmed, lut = trim_outer(table, launcher_frames(table))
        leaf = int(lut[table.n_stacks - 1])
        assert [f.file for f in trimmed.frames(leaf)][::-1] == ["train.py", "typer/main.py",
                                                               "torch/nn/modules/module.py"]
        assert bool(np.all(lut[: len(files) - 3] == -1))  # stacks of launcher frames only: none
