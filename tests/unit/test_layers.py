"""The house's floor plan, read from the code: every ``import`` of every module, parsed with ``ast``.

Rooms (tracekit's packages) stand on floors, lowest first (``FLOORS``). A module
may import its own room, a room on its floor or a lower one, and the
foundation (tracekit's top-level modules: errors, units, inputs, outputs,
progress, interrupts, workers, numpy_setup), never a room above it. The rooms' import
graph has no cycle, even between rooms of one floor, nor has the modules'; no module imports
another package's private ``_name`` module; and the few arrows the plan
forbids by name (``FORBIDDEN``) are absent. Every import counts: at the top
of a module, inside a function (loaded late) or under ``TYPE_CHECKING``.

An arrow that breaks a rule and is not mended yet is listed, with the reason,
in ``KNOWN``; the test fails when a listed arrow is gone, so the list only
shrinks.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "tracekit"

# Lowest first. ``gpu`` is the ground floor for the GPU (CUDA, driver, NVML: only
# ``errors`` below it). ``sim`` holds the real allocators' rules (PyTorch's rounding and
# settings in ``sim.torch_rules``), which the PyTorch snapshot importer reads.
# ``record`` shares the floor of ``budget`` and ``device``:
# a recording measures the budget before the program starts and probes the device
# at an OOM, and it imports the PyTorch snapshot importer after the program ends.
FLOORS: tuple[tuple[str, ...], ...] = (
    ("trace",),
    ("gpu",),
    ("sim",),
    ("importers", "synth"),
    ("budget", "device", "record"),
    ("analysis",),
    ("advise",),
    ("report", "fleet", "export", "pytest"),  # pytest: the plugin, which asks advise at a failure
    ("cli",),
)
FOUNDATION = "tracekit"  # the top-level modules (errors.py, units.py, ...): below every room

# (from room, to room) pairs that must not exist even where the floors allow them:
# what both need goes lower instead.
FORBIDDEN = {("device", "importers"), ("budget", "device"), ("budget", "record")}

# Arrows that break a rule today, each with why it is not mended here; (importer, imported).
KNOWN: dict[tuple[str, str], str] = {
    # The device's PyTorch replay reads PyTorch's history through the importer's action
    # codes; they belong below both (with PyTorch's rules).
    ("tracekit.device.torch_backend", "tracekit.importers.torch_columns"): "PyTorch action codes",
    ("tracekit.device.torch_loop", "tracekit.importers.torch_columns"): "PyTorch action codes",
}

# Module arrows that close a cycle inside one room today; (importer, imported).
KNOWN_CYCLES: dict[tuple[str, str], str] = {
    # Under TYPE_CHECKING only: the writer names ReplayResult, which engine defines and
    # which imports the writer late; the result type belongs in sim/result.py.
    ("tracekit.sim.output", "tracekit.sim.engine"): "type-only back reference",
}


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
PACKAGES = {m for m, p in MODULES.items() if p.name == "__init__.py"}


def imports_of(name: str) -> Iterator[str]:
    """The tracekit modules ``name`` imports (``from pkg import sub`` names the submodule)."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names if a.name.split(".")[0] == "tracekit")
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            if base.split(".")[0] != "tracekit":
                continue
            for a in node.names:
                sub = f"{base}.{a.name}"
                yield sub if sub in MODULES else base


def room(name: str) -> str:
    """``tracekit.device.replay`` -> ``device``; top-level modules -> the foundation (``__main__``: cli)."""
    parts = name.split(".")
    if name == "tracekit.__main__":
        return "cli"
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and name in PACKAGES) else FOUNDATION


FLOOR = {r: i for i, rooms in enumerate(FLOORS) for r in rooms} | {FOUNDATION: -1}
ARROWS = sorted({(m, t) for m in MODULES for t in imports_of(m) if t in MODULES and t != m})


def broken(rule: str) -> set[tuple[str, str]]:
    """The module arrows that break ``rule``."""
    tests = {
        "up": lambda s, d: FLOOR[room(d)] > FLOOR[room(s)],
        "forbidden": lambda s, d: (room(s), room(d)) in FORBIDDEN,
        "private": _private_outside,
    }
    return {(s, d) for s, d in ARROWS if tests[rule](s, d)}


def _private_outside(src: str, dst: str) -> bool:
    """``dst`` is a ``_name`` module and ``src`` is not inside the package that holds it."""
    home, _, leaf = dst.rpartition(".")
    private = leaf.startswith("_") and not leaf.startswith("__")
    return private and not (src == home or src.startswith(home + "."))


def test_every_room_stands_on_a_floor() -> None:
    rooms = {room(m) for m in MODULES} - {FOUNDATION}
    assert rooms <= set(FLOOR), f"rooms on no floor: {sorted(rooms - set(FLOOR))}"
    assert len(MODULES) > 100  # the walk found the package, not an empty folder


def test_the_foundation_imports_no_room() -> None:
    up = [(s, d) for s, d in ARROWS if room(s) == FOUNDATION and room(d) != FOUNDATION]
    assert up == []


def test_the_gpu_floor_stands_on_the_foundation_alone() -> None:
    """CUDA, the driver and NVML need nothing of tracekit but its errors: record, budget and device
    all build on them."""
    assert {d for s, d in ARROWS if room(s) == "gpu" and room(d) != "gpu"} == {"tracekit.errors"}


def test_no_module_imports_a_room_above_it() -> None:
    assert broken("up") - set(KNOWN) == set()


def test_no_forbidden_arrow_between_rooms() -> None:
    assert broken("forbidden") - set(KNOWN) == set()


def test_no_module_imports_another_packages_private_module() -> None:
    assert broken("private") - set(KNOWN) == set()


def test_the_rooms_import_each_other_without_a_cycle() -> None:
    graph: dict[str, set[str]] = {}
    for src, dst in ARROWS:
        if (src, dst) not in KNOWN and room(src) != room(dst):
            graph.setdefault(room(src), set()).add(room(dst))
    assert _cycle(graph) is None


def test_no_two_modules_import_each_other_even_late() -> None:
    """No module cycle, counting imports inside functions (``replay`` <-> ``torch_replay`` was one)."""
    assert _cycle(_module_graph(set(KNOWN) | set(KNOWN_CYCLES))) is None


def test_each_known_cycle_is_still_one() -> None:
    for arrow in KNOWN_CYCLES:
        assert _cycle(_module_graph(set(KNOWN) | set(KNOWN_CYCLES) - {arrow})) is not None, arrow


def _module_graph(leave_out: set[tuple[str, str]]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for src, dst in ARROWS:
        if (src, dst) not in leave_out:
            graph.setdefault(src, set()).add(dst)
    return graph


def test_each_known_exception_still_breaks_a_rule() -> None:
    """An arrow mended (or gone) leaves the list: the exceptions never outlive their cause."""
    breaking = broken("up") | broken("forbidden") | broken("private")
    assert set(KNOWN) - breaking == set()


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path that returns to its start, or None (depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt] if nxt in path else [*path, nxt]
            if nxt not in state and (found := visit(nxt, [*path, nxt])):
                return found
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start, [start])):
            return found
    return None


def test_the_cycle_finder_finds_a_cycle_and_passes_a_chain() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_the_rules_catch_an_arrow_up_and_a_private_import() -> None:
    assert FLOOR[room("tracekit.trace.reader")] < FLOOR[room("tracekit.cli.app")]
    assert room("tracekit.errors") == FOUNDATION and room("tracekit.gpu") == "gpu"
    assert _private_outside("tracekit.advise.run", "tracekit.sim.policies._x")
    assert not _private_outside("tracekit.sim.policies.torch", "tracekit.sim.policies._x")
