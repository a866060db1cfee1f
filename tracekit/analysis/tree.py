"""Live bytes by whole call stack as a tree (an icicle as text): outermost frame first.

``stack_tree(table, stack, nbytes)`` takes the blocks of one moment as two columns (each
block's stack id, -1 none, and its bytes) and returns a tree of frozen ``TreeNode``s:

- a stack's own bytes ``own[s]`` = Σ bytes of the blocks whose stack is ``s`` (one vector
  sum, no Python object per block);
- hidden frames (tracekit's always; C/C++ ``NATIVE`` frames unless ``TreeLimits.native``)
  give their bytes to the nearest shown frame outside them, and stacks that read alike once
  they are left out (the same shown frame under the same node) are one node;
- a node's ``bytes`` = its own + Σ its children's (rolled up through ``parent``, innermost
  level first), so the root holds Σ ``nbytes``; ``blocks`` likewise;
- children are sorted by bytes, largest first; a child is kept while its share of the root
  is at least ``min_share``, it is among the first ``max_children``, it is no deeper than
  ``max_depth`` and the tree holds fewer than ``max_nodes`` nodes (nodes are opened largest
  first, so the budget goes to the biggest branches); what is cut is counted in the parent's
  ``more`` (children) and ``more_bytes`` (their bytes).

Blocks with no stack sit under the root as "(no call stack)"; those whose every frame is hidden
(C/C++ frames collapsed, or tracekit's) as "(C/C++ or tracekit frames only)".
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import TypedDict

import numpy as np
from numba import njit

from tracekit.analysis.leaks import never_freed, pool_state_at
from tracekit.compiled import plain
from tracekit.inputs import safe_text
from tracekit.trace.callsite import FrameRoles, nearest
from tracekit.trace.events import Events
from tracekit.trace.stacks import NONE, Frame, StackTable, UserCode
from tracekit.units import format_size

NO_STACK = "(no call stack)"
NATIVE_ONLY = "(C/C++ or tracekit frames only)"
OOM_TREES = 8  # OOMs that get a tree: the fatal one, then the first handled ones


@dataclass(frozen=True)
class TreeLimits:
    """How much of a tree is kept (see the module docstring); ``native``: show C/C++ frames."""

    min_share: float = 0.01
    max_depth: int = 40
    max_children: int = 8
    max_nodes: int = 60
    native: bool = False


class TreeNodeJSON(TypedDict):
    """One node: ``frame`` as text, the frame's parts (null for the root and the buckets),
    ``bytes``/``blocks`` at or under it, largest child first, what was cut, and ``repeat``: the
    frame's nested calls of itself folded into this node (1: none)."""

    frame: str
    file: str | None
    line: int | None
    function: str | None
    kind: str | None
    user: bool
    bytes: int
    blocks: int
    children: list[TreeNodeJSON]
    more: int
    more_bytes: int
    repeat: int


@dataclass(frozen=True)
class TreeNode:
    """A frame (None: the root or a bucket named by ``text``) and the bytes held at or under it."""

    text: str
    frame: Frame | None
    user: bool
    bytes: int
    blocks: int
    children: tuple[TreeNode, ...] = ()
    more: int = 0  # children cut (each with its subtree)
    more_bytes: int = 0
    repeat: int = 1  # a run of the frame calling itself, folded into one node: its length

    def to_dict(self) -> TreeNodeJSON:
        f = self.frame
        return TreeNodeJSON(
            frame=self.text, file=f.file if f else None, line=f.line if f and f.line >= 0 else None,
            function=f.function if f else None, kind=f.kind.name.lower() if f else None, user=self.user,
            bytes=self.bytes, blocks=self.blocks, children=[c.to_dict() for c in self.children],
            more=self.more, more_bytes=self.more_bytes, repeat=self.repeat)

    def count(self) -> int:
        """Nodes in the tree, this one included."""
        return 1 + sum(c.count() for c in self.children)


def node_text(f: Frame) -> str:
    """``file:line in function`` (``file in function`` without a line; the file alone without both)."""
    if not f.function:
        return f.short()
    return f"{f.short()} in {f.function}"


@dataclass(frozen=True, eq=False)
class _Rolled:
    """Nodes as arrays: index < n_stacks are canonical stacks, then the two buckets."""

    parent: np.ndarray  # node id of the parent node, -1: the root
    bytes: np.ndarray  # int64 inclusive
    blocks: np.ndarray  # int64 inclusive
    own: np.ndarray  # int64 bytes of blocks ending at the node
    depth: np.ndarray  # int64, 1 for a child of the root


def stack_tree(table: StackTable, stack: np.ndarray, nbytes: np.ndarray, limits: TreeLimits = TreeLimits(),
               roles: FrameRoles | None = None) -> TreeNode:
    """The tree of ``nbytes`` by ``stack`` (parallel columns; see the module docstring)."""
    roles = roles if roles is not None else FrameRoles.of(table, UserCode())
    r = _roll_up(table, np.asarray(stack, np.int64), np.asarray(nbytes).astype(np.int64), limits, roles)
    return _build(table, r, limits, roles)


def _roll_up(table: StackTable, stack: np.ndarray, nbytes: np.ndarray, limits: TreeLimits,
             roles: FrameRoles) -> _Rolled:
    ns = table.n_stacks
    n_nodes = ns + 2  # + the "no stack" and "C/C++ only" buckets
    no_stack, native_only = ns, ns + 1
    hidden = roles.tracekit | (roles.native & (not limits.native))
    shown = ~hidden[table.frame] if ns else np.zeros(0, bool)
    eff = nearest(table.parent, shown)  # the shown stack a stack's own bytes go to
    ext = np.append(eff, NONE)
    outer = ext[table.parent]  # the nearest shown stack strictly outside
    canon = _canonical(table, shown, outer)
    # Each block's node: its stack's shown stack, canonical; the buckets where there is none.
    valid = stack >= 0
    node = np.full(len(stack), no_stack, np.int64)
    target = np.where(eff >= 0, canon[np.maximum(eff, 0)], native_only)
    node[valid] = target[stack[valid]]
    own = np.zeros(n_nodes, np.int64)
    np.add.at(own, node, nbytes)
    blocks = np.bincount(node, minlength=n_nodes).astype(np.int64)
    parent = np.full(n_nodes, NONE, np.int64)
    parent[:ns] = np.where(outer >= 0, canon[np.maximum(outer, 0)], NONE)
    depth = _depths(parent)
    inc, incb = own.copy(), blocks.copy()
    is_node = np.zeros(n_nodes, bool)
    is_node[:ns] = shown & (canon == np.arange(ns))
    is_node[ns:] = True
    _roll_into_parents(parent, is_node, inc, incb)
    inc[~is_node] = 0
    incb[~is_node] = 0
    return _Rolled(parent, inc, incb, own, depth)


def _canonical(table: StackTable, shown: np.ndarray, outer: np.ndarray) -> np.ndarray:
    """Per stack, the first shown stack with the same shown frame under the same canonical
    node; hidden stacks keep their own id (unused). One forward pass (``_first_of_key``):
    ``outer[s] < s``, so the node above is canonical before ``s`` is reached."""
    ns = table.n_stacks
    if ns == 0:
        return np.zeros(0, np.int64)
    return _first_of_key(shown, outer.astype(np.int64), table.frame.astype(np.int64), table.n_frames)


@njit(cache=True)
def _first_of_key(shown: np.ndarray, outer: np.ndarray, frame: np.ndarray, n_frames: int
                  ) -> np.ndarray:  # pragma: no cover - numba
    """canon[s] = the smallest shown s' with key(s') = key(s), key = (canon[outer] + 1) ×
    (n_frames + 1) + frame, in ascending stack order; an open-addressing table of 2^k ≥ 2·n slots
    (linear probing) maps keys to their first stack: O(n_stacks) expected, whatever the depth."""
    ns = len(frame)
    canon = np.arange(ns)
    size = 2
    while size < 2 * ns:
        size *= 2
    mask = size - 1
    keys = np.full(size, -1, np.int64)
    first = np.zeros(size, np.int64)
    for s in range(ns):
        if not shown[s]:
            continue
        up = canon[outer[s]] if outer[s] >= 0 else -1
        key = (up + 1) * (n_frames + 1) + frame[s]
        h = ((key * 0x9E3779B1) ^ (key >> 29)) & mask  # Fibonacci-style mix: ids are near-sequential
        while keys[h] != -1 and keys[h] != key:
            h = (h + 1) & mask
        if keys[h] == -1:
            keys[h] = key
            first[h] = s
        canon[s] = first[h]
    return canon


@plain
def _roll_into_parents(parent: np.ndarray, is_node: np.ndarray, inc: np.ndarray,
                       incb: np.ndarray) -> None:  # pragma: no cover - numba
    """inc[parent[i]] += inc[i] (and blocks) for every node, children before parents: one
    reverse pass, since a node's parent id is smaller than its own (canonical ids are the
    first of their key, ``parent < child`` in the stack table; the buckets hang off the root)."""
    for i in range(len(parent) - 1, -1, -1):
        p = parent[i]
        if is_node[i] and p >= 0:
            inc[p] += inc[i]
            incb[p] += incb[i]


def _depths(parent: np.ndarray) -> np.ndarray:
    """1 + the number of nodes above a node (parent -1 = the root), by pointer jumping:
    ``dist += dist[jump]; jump = jump[jump]`` until every jump reaches the root,
    ⌈log2 depth⌉ + 1 vector steps."""
    n = len(parent)
    jump = np.append(np.where(parent < 0, n, parent), n).astype(np.int64)  # n: the root, fixed
    dist = np.append(parent >= 0, False).astype(np.int64)
    while bool(np.any(jump[:n] != n)):
        dist = dist + dist[jump]
        jump = jump[jump]
    return dist[:n] + 1


def _build(table: StackTable, r: _Rolled, limits: TreeLimits, roles: FrameRoles) -> TreeNode:
    """Open nodes largest first under the limits, then freeze them bottom-up. A node opens at
    the end of its run (``_runs``): the children shown are those of the run's innermost node."""
    total = int(r.bytes[r.parent < 0].sum()) if len(r.bytes) else 0
    live = np.flatnonzero(r.bytes > 0)
    order = live[np.lexsort((-r.bytes[live], r.parent[live]))]  # by parent, largest first
    par = r.parent[order]
    floor = limits.min_share * total
    end, run = _runs(table, r, live)

    def kids(p: int) -> np.ndarray:
        lo, hi = np.searchsorted(par, p, "left"), np.searchsorted(par, p, "right")
        return order[lo:hi]

    kept: dict[int, list[int]] = {}
    cut: dict[int, tuple[int, int]] = {}
    budget = limits.max_nodes
    heap: list[tuple[int, int, int]] = [(-total, NONE, 0)]  # (-bytes, node, depth shown)
    while heap:
        _, p, depth = heapq.heappop(heap)
        ch = kids(int(end[p]) if p >= 0 else NONE)
        take = [] if depth >= limits.max_depth else \
            [int(c) for c in ch[:limits.max_children] if r.bytes[c] >= floor and r.bytes[c] > 0]
        take = take[:max(budget, 0)]
        if depth < limits.max_depth and len(ch) - len(take) == 1:
            take.append(int(ch[-1]))  # its own line costs no more than "… 1 more"
        budget -= len(take)
        kept[p] = take
        rest = ch[len(take):]
        cut[p] = (len(rest), int(r.bytes[rest].sum()))
        for c in take:
            heapq.heappush(heap, (-int(r.bytes[c]), c, depth + 1))

    def freeze(p: int) -> TreeNode:
        children = tuple(freeze(c) for c in kept.get(p, []))
        more, more_bytes = cut.get(p, (0, 0))
        if p < 0:
            return TreeNode("everything", None, False, total, int(r.blocks[r.parent < 0].sum()),
                            children, more, more_bytes)
        if p >= table.n_stacks:
            text = NO_STACK if p == table.n_stacks else NATIVE_ONLY
            return TreeNode(text, None, False, int(r.bytes[p]), int(r.blocks[p]), children, more, more_bytes)
        f = int(table.frame[p])
        frame = table.frame_at(f)
        return TreeNode(node_text(frame), frame, bool(roles.user[f]), int(r.bytes[p]), int(r.blocks[p]),
                        children, more, more_bytes, int(run[p]))

    return freeze(NONE)


def _runs(table: StackTable, r: _Rolled, live: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per node, the innermost node of its run and the run's length: a node continues its
    parent's run when it is the parent's only live child and shows the same frame (a recursion:
    the same file:line:function calling itself). Pointer jumping on ``next`` (the child that
    continues a node's run, else the node itself): ``end = end[end]``, ``run += run[end]``,
    ⌈log2 run⌉ + 1 vector steps."""
    n = len(r.parent)
    ns = table.n_stacks
    lp = r.parent[live]
    n_live = np.bincount(lp[lp >= 0], minlength=n)
    frame = np.full(n, NONE, np.int64)
    frame[:ns] = table.frame
    c = live[(lp >= 0) & (live < ns)]
    c = c[(frame[c] == frame[r.parent[c]]) & (n_live[r.parent[c]] == 1)]
    end = np.arange(n, dtype=np.int64)
    end[r.parent[c]] = c
    run = np.ones(n, np.int64)
    steps = (end != np.arange(n)).astype(np.int64)  # nodes of the run past this one, so far
    while True:
        nxt = end[end]
        if np.array_equal(nxt, end):
            break
        steps = steps + steps[end]
        end = nxt
    return end, run + steps


def tree_lines(root: TreeNode, title: str) -> list[str]:
    """The tree as text, one line per node: ``bytes  share  frame`` indented by depth, the user's
    frames marked ``*``, each frame's text escaped for a terminal, "… N more (X)" where cut."""
    lines = [f"{format_size(root.bytes):>11}  {share_of(root.bytes, root.bytes):>6}  {title}"]
    total = root.bytes

    def share(b: int) -> str:
        return share_of(b, total)

    def walk(n: TreeNode, depth: int) -> None:
        pad = "  " * depth
        for c in n.children:
            mark = "*" if c.user else " "
            fold = f" … ×{c.repeat:,}" if c.repeat > 1 else ""
            text = f"{safe_text(c.text)}{fold}"
            lines.append(f"{format_size(c.bytes):>11}  {share(c.bytes):>6} {mark}{pad}{text}")
            walk(c, depth + 1)
        if n.more:
            lines.append(f"{'':>11}  {'':>6}  {pad}  … {n.more:,} more ({format_size(n.more_bytes)})")

    walk(root, 1)
    return lines


def share_of(part: int, total: int) -> str:
    """``part / total`` as a percentage with one decimal, "n/a" for an empty total."""
    return f"{part / total:.1%}" if total > 0 else "n/a"


class OOMTreeJSON(TypedDict):
    seq: int
    handled: bool
    tree: TreeNodeJSON


class TreesJSON(TypedDict):
    """``analyze --tree --json``'s ``trees``: live bytes by stack at the peak of live bytes (after
    event ``peak_seq``), before each OOM that has a tree (``ooms``; ``ooms_without_tree`` more
    have none), and never freed; ``native_collapsed``: C/C++ frames folded into their caller."""

    peak_seq: int | None
    peak: TreeNodeJSON | None
    ooms: list[OOMTreeJSON]
    ooms_without_tree: int
    never_freed: TreeNodeJSON
    native_collapsed: bool


@dataclass(frozen=True)
class OOMTree:
    seq: int
    handled: bool
    tree: TreeNode


@dataclass(frozen=True)
class Trees:
    """The trees of one device's trace (see ``TreesJSON``)."""

    peak_seq: int | None
    peak: TreeNode | None
    ooms: tuple[OOMTree, ...]
    ooms_without_tree: int
    never_freed: TreeNode
    native_collapsed: bool

    def to_dict(self) -> TreesJSON:
        return TreesJSON(
            peak_seq=self.peak_seq, peak=self.peak.to_dict() if self.peak is not None else None,
            ooms=[OOMTreeJSON(seq=o.seq, handled=o.handled, tree=o.tree.to_dict()) for o in self.ooms],
            ooms_without_tree=self.ooms_without_tree, never_freed=self.never_freed.to_dict(),
            native_collapsed=self.native_collapsed)

    def to_text(self) -> str:
        note = "; C/C++ frames folded into their caller (--tree-native shows them)" \
            if self.native_collapsed else ""
        out = [f"live bytes by call stack, outermost frame first (* = your code{note})"]
        if self.peak is not None:
            out += ["", *tree_lines(self.peak, f"live at the peak of live bytes (after seq {self.peak_seq})")]
        for o in self.ooms:
            fate = "handled" if o.handled else "fatal"
            out += ["", *tree_lines(o.tree, f"live at the {fate} OOM at seq {o.seq} (before the request)")]
        if self.ooms_without_tree:
            out += ["", f"... and {self.ooms_without_tree:,} more OOMs without a tree"]
        out += ["", *tree_lines(self.never_freed, "never freed (live at the end)")]
        return "\n".join(out)


@dataclass(frozen=True, eq=False)
class TreeInputs:
    """One device's events and what its trees need: each event's stack id, the table, the roles."""

    ev: Events
    mate: np.ndarray
    stack: np.ndarray
    table: StackTable
    roles: FrameRoles


def trees_of(t: TreeInputs, peak: int | None, ooms: list[tuple[int, bool]], limits: TreeLimits) -> Trees:
    """The trees at the peak (event index ``peak``: the blocks live after it), before each OOM
    (``ooms``: (event index, handled), seq order; the fatal one and the first handled ones up to
    ``OOM_TREES``) and at the end (blocks never freed)."""
    def at(k: int) -> TreeNode:
        state = pool_state_at(t.ev, t.mate, k)
        return stack_tree(t.table, t.stack[state.block_index], state.block_size, limits, t.roles)

    fatal = [o for o in ooms if not o[1]]
    chosen = sorted(fatal[:1] + [o for o in ooms if o[1]][:OOM_TREES - len(fatal[:1])])
    end = never_freed(t.ev, t.mate)
    native = bool(np.any(t.roles.native)) and not limits.native
    return Trees(
        peak_seq=int(t.ev.seq[peak]) if peak is not None else None,
        peak=at(peak + 1) if peak is not None else None,
        ooms=tuple(OOMTree(int(t.ev.seq[k]), handled, at(k)) for k, handled in chosen),
        ooms_without_tree=len(ooms) - len(chosen),
        never_freed=stack_tree(t.table, t.stack[end], t.ev.rounded[end], limits, t.roles),
        native_collapsed=native)
