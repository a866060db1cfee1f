"""Exports: a trace in the formats of the tools people have (``tracekit export``).

``moments`` picks what an export shows (the blocks live at the peak, at each OOM, never freed, all
allocated, by stack); ``speedscope`` writes those as a speedscope profile, ``torch_snapshot`` writes
the whole history as a PyTorch memory snapshot that PyTorch's MemoryViz opens. See ``docs/export.md``.
"""
