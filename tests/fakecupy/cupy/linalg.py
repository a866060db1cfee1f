"""``cupy.linalg.eigh`` of the stand-in: imports the compiled solver module on first use, as CuPy does."""


def eigh(nbytes):  # type: ignore[no-untyped-def]
    import cupyx._cusolver  # lazily, like cupy/linalg/_eigenvalue.py

    return cupyx._cusolver.workspace(nbytes)
