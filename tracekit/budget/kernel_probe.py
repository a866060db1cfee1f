"""``--kernel-local-bytes N``: how much device memory a local-memory-heavy kernel takes and keeps.

A kernel with a ``volatile`` per-thread array of N bytes is compiled with
NVRTC (CuPy ``RawKernel``), loaded, and launched over every resident thread
slot of the device (SMs x max threads per SM, in blocks of 128). cudaMemGetInfo
is read before loading, after loading (module + an 8-byte output array), after
the launch, after unloading and freeing the buffer (``kept``: what the context
keeps, the local-memory reservation) and after setting ``cudaLimitStackSize``
back to its old value (``after_restore``: whether the reservation can be handed
back). The seed's model predicts ``local_size_bytes x threads per SM x SMs``.
"""

from __future__ import annotations

from tracekit.budget.shapes import KernelLocal
from tracekit.errors import DeviceError, UsageError
from tracekit.gpu.driver import LIMIT_CODES

_SRC = r"""
extern "C" __global__ void local_probe(float* out, int salt) {
    volatile float buf[%(words)d];
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    for (int i = 0; i < %(words)d; ++i) buf[i] = (float)(t + i + salt);
    float s = 0.0f;
    for (int i = t %% 7; i < %(words)d; i += 61) s += buf[i];
    if (s == -1.0f) out[0] = s;  /* never true; keeps the array alive */
    if (t == 0) out[1] = buf[%(words)d - 1];
}
"""
_LIMIT_STACK = LIMIT_CODES["stack_size"]  # cudaLimitStackSize
MAX_LOCAL = 512 * 1024  # CUDA's per-thread local memory limit


def probe_kernel_local(device: int, local_bytes: int) -> KernelLocal:
    """Measure the free-memory cost of one kernel with ``local_bytes`` of local memory per thread."""
    if not 4 <= local_bytes <= MAX_LOCAL:
        raise UsageError(f"--kernel-local-bytes must be between 4 and {MAX_LOCAL}, got {local_bytes}")
    import cupy
    import numpy

    rt = cupy.cuda.runtime
    pool = cupy.get_default_memory_pool()
    words = local_bytes // 4
    with cupy.cuda.Device(device):
        props = rt.getDeviceProperties(device)
        sms, tpsm = int(props["multiProcessorCount"]), int(props["maxThreadsPerMultiProcessor"])
        stack_before = int(rt.deviceGetLimit(_LIMIT_STACK))
        free0 = int(rt.memGetInfo()[0])
        try:
            kernel = cupy.RawKernel(_SRC % {"words": words}, "local_probe")
            lsize = int(kernel.local_size_bytes)
            out = cupy.zeros(2, dtype=cupy.float32)
        except Exception as e:
            raise DeviceError(f"could not compile or load the local-memory probe kernel ({e})") from None
        free1 = int(rt.memGetInfo()[0])
        block = 128
        grid = sms * (tpsm // block)
        try:
            kernel((grid,), (block,), (out, numpy.int32(1)))
            rt.deviceSynchronize()
        except Exception as e:
            del out
            pool.free_all_blocks()
            raise DeviceError(f"the local-memory probe kernel failed to launch ({e})") from None
        free2 = int(rt.memGetInfo()[0])
        stack_after = int(rt.deviceGetLimit(_LIMIT_STACK))
        del out, kernel
        pool.free_all_blocks()  # the 8-byte output's page goes back, so only the context keeps memory
        free3 = int(rt.memGetInfo()[0])
        restored = None
        try:
            rt.deviceSetLimit(_LIMIT_STACK, stack_before)
            restored = int(rt.memGetInfo()[0])
        except Exception:
            pass
    model = lsize * tpsm * sms
    return KernelLocal(
        local_bytes=local_bytes,
        local_size_bytes=lsize,
        grid=grid,
        block=block,
        free_before=free0,
        load_bytes=free0 - free1,
        launch_bytes=free1 - free2,
        kept_bytes=free0 - free3,
        stack_size_before=stack_before,
        stack_size_after=stack_after,
        model_bytes=model,
        launch_over_model=(free1 - free2) / model if model else None,
        free_after_restore=restored,
        restore_gave_back=None if restored is None else restored - free3,
    )
