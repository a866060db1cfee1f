"""Build hook: compile tracekit's kernels when the package is built (``tracekit/cli/precompile.py``).

Everything else about the package is in ``pyproject.toml``. An editable
install (``pip install -e .``, what the README's scripts run) runs every verb
once on small traces after the build, so the compiled kernels are in numba's
on-disk cache beside the sources and no verb compiles anything at run time.
``TRACEKIT_NO_PRECOMPILE=1`` skips the step. A wheel built for another machine
cannot carry the cache (it is specific to the CPU and to the installed files),
so there the kernels compile on first use, or with ``python -m tracekit.cli.precompile``.
"""

import os
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildPy(build_py):
    def run(self) -> None:
        super().run()
        if not getattr(self, "editable_mode", False) or os.environ.get("TRACEKIT_NO_PRECOMPILE"):
            return
        root = os.path.dirname(os.path.abspath(__file__))
        path = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
        env = {**os.environ, "PYTHONPATH": path}
        step = [sys.executable, "-m", "tracekit.cli.precompile"]
        done = subprocess.run(step, cwd=root, env=env, check=False)
        if done.returncode:
            print("tracekit: warning: the kernels were not compiled at build time; they compile on first use",
                  file=sys.stderr)


setup(cmdclass={"build_py": BuildPy})
