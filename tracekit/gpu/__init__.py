"""The ground floor for the GPU: every call into CUDA and NVML that record, budget and device share.

``cuda``: CuPy imported and a device ordinal checked, each failure one
``DeviceError`` sentence; ``driver``: the CUDA driver over ctypes (is the
primary context active, the runtime limits ``cuCtxGetLimit`` reads);
``nvml``: NVML through nvidia-ml-py (memory figures, compute processes, names), which
answers without creating a CUDA context. Nothing here imports another
tracekit package but ``tracekit.errors``; importing this package imports
nothing (no CuPy, no CUDA library is loaded until a function is called).
"""
