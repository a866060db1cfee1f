"""Build hook: compile tracekit's kernels when the package is built (``tracekit/cli/precompile.py``).

Everything else about the package is in ``pyproject.toml``. After the build
step every verb runs once on small traces, so the compiled kernels are in
numba's on-disk cache and no verb compiles anything at run time: beside the
sources for an editable install (``pip install -e .``, what the README's
scripts run), inside the build tree for a wheel (``pip install .``,
``pip wheel .``), which then carries them. numba keys its cache on the source
files' contents and on the CPU, so a wheel's kernels load on any machine with
the build machine's CPU model; elsewhere they compile on first use, or with
``python -m tracekit.cli.precompile``. ``TRACEKIT_NO_PRECOMPILE=1`` skips the step.

The C extensions ``tracekit.record._fastpath`` (the recorder's frame-window hash and shared-memory
ring) and ``tracekit.trace._readpass`` (the reader's pass, so a first read need not wait for numba)
are built where a C compiler is found and left out elsewhere (``optional=True``: the build warns
and goes on), since ``tracekit.record.fastpath`` falls back to pure Python and
``tracekit.trace.readpass`` to numba without them. An editable install builds them beside their
sources; ``python setup.py build_ext --inplace`` rebuilds them.
"""

import os
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_py import build_py


class BuildPy(build_py):
    def run(self) -> None:
        super().run()
        if os.environ.get("TRACEKIT_NO_PRECOMPILE", "") not in ("", "0"):
            return
        root = os.path.dirname(os.path.abspath(__file__))
        # The package the verbs import, and so where numba writes the kernels.
        editable = getattr(self, "editable_mode", False)
        where = root if editable else os.path.abspath(self.build_lib)
        path = os.pathsep.join(filter(None, [where, os.environ.get("PYTHONPATH")]))
        env = {**os.environ, "PYTHONPATH": path}
        if not editable:  # a wheel carries the kernels, not bytecode (pip compiles that at install)
            env["PYTHONDONTWRITEBYTECODE"] = "1"
        step = [sys.executable, "-m", "tracekit.cli.precompile", "--traces", os.path.join(root, "traces")]
        done = subprocess.run(step, cwd=where, env=env, check=False)
        if done.returncode:
            print("tracekit: warning: the kernels were not compiled at build time; they compile on first use",
                  file=sys.stderr)


setup(
    cmdclass={"build_py": BuildPy},
    ext_modules=[Extension("tracekit.record._fastpath", ["tracekit/record/_fastpath.c"], optional=True),
                 Extension("tracekit.trace._readpass", ["tracekit/trace/_readpass.c"], optional=True)],
)
