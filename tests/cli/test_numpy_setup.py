"""Verbs that read traces, and worker processes, load NumPy as ``tracekit.numpy_setup`` says (one
BLAS thread; no huge pages asked for where the machine's balloon reports free pages to its host),
and leave the environment as it was.

Each case runs in a fresh interpreter, where NumPy is not loaded yet. A thread count of the process
tells how many threads loading NumPy started; the huge pages a 64 MiB array got (``AnonHugePages``
of its mapping in ``/proc/self/smaps``) tell whether NumPy asked for them, where the kernel gives
transparent huge pages only to memory that asks (``madvise`` mode)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tracekit.numpy_setup import free_pages_reported

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/task"),
                                reason="counts threads in /proc (Linux)")

VARIABLES = ("OPENBLAS_NUM_THREADS", "NUMPY_MADVISE_HUGEPAGE")

VERB = r"""
import json, os, sys
before = len(os.listdir("/proc/self/task"))
from tracekit.cli.app import numpy_for
numpy_for(sys.argv[1:])
import numpy
print(json.dumps({"added_threads": len(os.listdir("/proc/self/task")) - before,
                  "env": [os.environ.get(v) for v in ("OPENBLAS_NUM_THREADS", "NUMPY_MADVISE_HUGEPAGE")]}))
"""

HUGE = r"""
import json, sys
from tracekit.cli.app import numpy_for
numpy_for(sys.argv[1:])
import numpy as np
a = np.ones(64 << 17)  # 64 MiB, every page touched
start = a.__array_interface__["data"][0]
end = start + a.nbytes
huge, inside = 0, False
with open("/proc/self/smaps") as f:  # the mappings the array spans (NumPy's madvise splits them)
    for line in f:
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo < end and start < hi
        elif inside and head == "AnonHugePages:":
            huge += int(line.split()[1])
print(json.dumps(huge))
"""

WORKER = r"""
import json, os
from tracekit.workers import Pool

def threads_and_env(_):
    import numpy  # loaded by the worker's start already
    return len(os.listdir("/proc/self/task")), os.environ.get("OPENBLAS_NUM_THREADS")

if __name__ == "__main__":
    pool = Pool(2)
    try:
        got = [r for _, r in pool.each(threads_and_env, [(0,), (1,)], on_error=lambda i, e: None)]
    finally:
        pool.close()
    print(json.dumps(got))
"""


def clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in VARIABLES} | (extra or {})


def python(code: str, *argv: str, env: dict[str, str] | None = None) -> object:
    out = subprocess.run([sys.executable, "-c", code, *argv], env=clean_env(env), capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout)


def thp_mode() -> str | None:
    """The kernel's transparent huge page mode (the bracketed word), None where it has none."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            text = f.read()
    except OSError:
        return None
    return text[text.index("[") + 1:text.index("]")] if "[" in text else None


def test_a_reading_verb_loads_numpy_without_blas_threads_and_puts_the_environment_back() -> None:
    assert python(VERB, "replay", "t.parquet") == {"added_threads": 0, "env": [None, None]}
    assert python(VERB, "--no-color", "analyze", "t.parquet") == {"added_threads": 0, "env": [None, None]}


def test_record_and_a_value_the_user_set_are_left_alone() -> None:
    assert python(VERB, "record", "app.py")["env"] == [None, None]  # type: ignore[index]
    mine = {"OPENBLAS_NUM_THREADS": "3", "NUMPY_MADVISE_HUGEPAGE": "1"}
    got = python(VERB, "replay", "t.parquet", env=mine)
    assert got["env"] == ["3", "1"]  # type: ignore[index]


@pytest.mark.skipif(thp_mode() != "madvise",
                    reason="needs transparent huge pages in madvise mode (given only where asked for)")
def test_a_reading_verb_asks_for_huge_pages_only_where_they_cost_nothing_extra() -> None:
    verb = python(HUGE, "replay", "t.parquet")
    asked = python(HUGE, "replay", "t.parquet", env={"NUMPY_MADVISE_HUGEPAGE": "1"})
    record = python(HUGE, "record", "app.py")  # the user's program: NumPy as it loads by itself
    if asked == 0 and record == 0:
        pytest.skip("the kernel gave no huge page to an array that asked for them (none free)")
    assert asked > 0 and record > 0
    assert (verb == 0) if free_pages_reported() else (verb > 0)


@pytest.mark.parametrize(("features", "reported"), [
    ("01100101" + "0" * 120, True),  # this development machine's balloon: bit 5 set
    ("01100001" + "0" * 120, False),
    ("01100", False),  # too short to say
    (None, False),  # no balloon at all
])
def test_free_page_reporting_is_read_from_the_balloons_feature_bits(tmp_path: object,
                                                                    features: str | None,
                                                                    reported: bool) -> None:
    devices = os.path.join(str(tmp_path), "virtio_balloon")
    if features is not None:
        os.makedirs(os.path.join(devices, "virtio0"))
        with open(os.path.join(devices, "virtio0", "features"), "w") as f:
            f.write(features + "\n")
        os.makedirs(os.path.join(devices, "module"))  # the driver's other entries are not devices
    assert free_pages_reported(devices) is reported


def test_worker_processes_load_numpy_with_one_blas_thread(tmp_path: object) -> None:
    """A worker of the one pool (fleet's) runs its tasks on its main thread alone: NumPy started no
    BLAS thread there, and the worker's environment is as the parent's."""
    script = os.path.join(str(tmp_path), "workers_numpy.py")
    with open(script, "w") as f:
        f.write(WORKER)
    out = subprocess.run([sys.executable, script], capture_output=True, text=True, check=True,
                         env=clean_env())
    assert json.loads(out.stdout) == [[1, None], [1, None]]
