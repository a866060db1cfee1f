"""The browser report's data model: one JSON object, every shape a TypedDict (``docs/report-page.md``).

Bulk numbers travel as ``Column`` objects: a little-endian typed array, optionally
delta-encoded (``x[i] = x[i-1] + d[i]``, for ascending columns), deflated (zlib)
and base64-encoded, so a column of a million event indices costs a few kB and the
page decodes it with the browser's own ``DecompressionStream``. Strings from the
trace (call-site files and functions, process names, explanations) are plain JSON
strings, escaped as ``tracekit.inputs.safe_text`` escapes them (``page.text``: no bidi
override or other character that is not printable reaches the page): the page inserts them
with ``textContent`` only.

Event indices (``index``, ``malloc``, ``free``, ``alloc`` …) count rows of the
reported device's events from 0; ``seq`` is the trace's own sequence number.
"""

from __future__ import annotations

from typing import Literal, TypedDict

Dtype = Literal["u8", "i32", "f32", "f64"]


class Column(TypedDict):
    """A typed array: ``n`` values of ``dtype``; ``delta`` = stored as differences (prefix-sum to decode)."""

    dtype: Dtype
    n: int
    delta: bool
    z: str  # base64 of zlib-deflated little-endian bytes


class SeriesInfo(TypedDict):
    """One curve of the timeline: ``axis`` "pool" (the left axis, MiB), "device" (device free, its own
    right axis) or "frag" (the fragmentation strip below, %); ``help``: what it is (the legend's hover)."""

    key: str  # live | requested | reserved | largest_free | frag | device_free
    label: str
    unit: Literal["bytes", "percent"]
    axis: Literal["pool", "device", "frag"]
    help: str


class Level(TypedDict):
    """One level of detail: bucket ``i`` covers events ``[i*bucket, min((i+1)*bucket, n))``."""

    bucket: int
    count: int
    lo: dict[str, Column]  # series key -> f32 minimum within each bucket
    hi: dict[str, Column]  # series key -> f32 maximum within each bucket


class Points(TypedDict):
    index: Column  # i32 event index
    bytes: Column  # f64


class Timeline(TypedDict):
    n: int  # events of the reported device
    t_ns: Column  # f64 nanoseconds since the first event, per event of the finest level's bucket starts
    seq: Column  # f64 seq at each bucket start of the finest level
    series: list[SeriesInfo]
    levels: list[Level]  # coarsest first
    measured_free: Points | None
    limit_bytes: int | None
    limit_what: str  # what the limit is ("pool limit")


class BudgetPart(TypedDict):
    name: str  # other processes | context | local memory | heaps | pool reserved | free | unaccounted
    bytes: int | None
    how: str  # measured | estimated | derived


class BudgetBar(TypedDict):
    label: str  # "start" or "OOM at seq N"
    parts: list[BudgetPart]
    total: int | None


class Budget(TypedDict):
    """The device budget at start and at one OOM; ``changed``: the term that changed most."""

    start: BudgetBar
    oom: BudgetBar
    changed: str | None
    change_bytes: int | None
    takers: str
    pool_limit: int | None  # the pool's cap (bytes), where the trace records one
    capped: str | None  # "pool capped at 4.19 GiB: …" where the device had more free than the cap


class OOMColumns(TypedDict):
    """Every OOM (every device's), in seq order, as columns; OOM id = row."""

    count: int
    seq: Column  # f64
    index: Column  # i32 event index on the reported device; -1 when on another device
    t_ns: Column  # f64 ns since the reported device's first event
    device: Column  # i32
    size: Column  # f64 requested bytes
    rounded: Column  # f64 bytes the allocator needed
    handled: Column  # u8: 1 the program survived it, 0 fatal
    diagnosis: Column  # u8 index into ``diagnoses``
    diagnoses: list[str]
    stack: Column  # i32 stack id, -1 none
    group: Column  # i32 index into ``PageModel.oom_groups``
    live_bytes: Column  # f64 at the OOM
    reserved_bytes: Column  # f64
    largest_free_block: Column  # f64
    device_free: Column  # f64, -1 unknown


class OOMDetail(TypedDict):
    """What the analyzer worked out in full for one OOM (the reported one and the first ones)."""

    id: int
    explanation: str | None
    handler: str | None
    device_free_source: str
    budget: Budget | None
    reported: str | None  # the request as the program's own error names it ("Tried to allocate 122.00 MiB")
    reported_why: str | None  # why that differs from the recorded size (None: it does not)


class OOMGroup(TypedDict):
    """OOMs of one outcome, call-site and handler: the fatal ones first, then the handled ones by count.
    ``ids``: the first ``GROUP_IDS`` OOM ids of the group, in seq order (``count`` in all)."""

    handled: bool
    site: str | None
    handler: str | None
    count: int
    ids: list[int]
    rounded_min: int
    rounded_max: int


class Peak(TypedDict):
    live_bytes: int
    live_seq: int | None
    live_index: int | None
    reserved_bytes: int
    reserved_seq: int | None
    reserved_index: int | None


class Frames(TypedDict):
    """The FRAME table, column-wise: frame ``i`` is (file[i], line[i], function[i]) of kind ``kind[i]``
    (``kinds[kind[i]]``: user, library, stdlib, native; ``tracekit.trace.stacks.FrameKind``);
    ``user[i]``: the frame is the user's code (``tracekit.trace.callsite.FrameRoles``: ``UserCode``,
    ``--user-code PATH``, never an array library's or tracekit's unless PATH says so);
    line -1 when unknown."""

    file: list[str]
    line: list[int]
    function: list[str]
    kind: list[int]
    user: list[bool]
    kinds: list[str]  # the kind names, index = kind


class Stacks(TypedDict):
    """The STACK table: stack ``i`` = frame ``frame[i]`` called from stack ``parent[i]`` (-1: outermost);
    ``parent[i] < i``, so a walk outwards ends and a pass from the last id down rolls bytes up.
    Each stack's call-site as ``tracekit analyze`` names it (``tracekit.trace.callsite.CallSites``):
    ``user_frame[i]`` the user's innermost frame, ``request_frame[i]`` the frame that made the request
    (frame ids, -1 none), ``label[i]`` the id of its label in ``labels`` (-1: nothing to name)."""

    frame: list[int]
    parent: list[int]
    user_frame: list[int]
    request_frame: list[int]
    label: list[int]
    labels: list[str]  # "U.file:U.line in U.function → R.file:R.line", or one frame as path:line:function


class Blocks(TypedDict):
    """Every block the page needs (a malloc and its free), in malloc order."""

    addr: Column  # f64 address
    size: Column  # f64 requested bytes
    rounded: Column  # f64 bytes handed out
    stack: Column  # i32 stack id, -1 none
    segment: Column  # i32 segment id holding the block, -1 none
    malloc: Column  # i32 event index of the malloc (delta)
    free: Column  # i32 event index of the free, -1 never freed
    malloc_seq: Column  # f64 (delta)
    free_seq: Column  # f64, -1 never freed
    malloc_t: Column  # f64 ns since the first event (delta)
    free_t: Column  # f64, -1 never freed


class Segments(TypedDict):
    addr: Column  # f64
    size: Column  # f64
    alloc: Column  # i32 event index of the segment_alloc
    free: Column  # i32 event index of the segment_free, -1 never
    alloc_seq: Column  # f64
    free_seq: Column  # f64, -1 never
    alloc_t: Column  # f64
    free_t: Column  # f64, -1 never


class Keyframes(TypedDict):
    """Window ``w``'s keyframe, what is live just before event ``windows[w].start``: block ids
    ``blocks[block_at[w]:block_at[w + 1]]`` and segment ids ``segments[segment_at[w]:segment_at[w + 1]]``
    (one column each for every window, so a page of a thousand windows decodes four columns)."""

    blocks: Column  # i32
    block_at: Column  # i32, windows + 1 offsets
    segments: Column  # i32
    segment_at: Column  # i32


class Window(TypedDict):
    """Events ``[start, end)`` are all in ``events``; the state inside replays from the window's keyframe."""

    start: int
    end: int
    reason: str  # all | peak | OOM | even (merged windows join their reasons)


class EventColumns(TypedDict):
    """The kept events: index (delta), op (0 malloc, 1 free, 2 segment_alloc, 3 segment_free, 4 oom),
    ref (block id, segment id or OOM id; -1 none), seq (delta) and t_ns (delta)."""

    index: Column
    op: Column
    ref: Column
    seq: Column
    t_ns: Column


class State(TypedDict):
    complete: bool  # every event is kept (one window)
    kept: int
    note: str
    blocks: Blocks
    segments: Segments
    events: EventColumns
    windows: list[Window]
    keyframes: Keyframes
    pooled: bool  # the trace has segment rows


class TableView(TypedDict):
    """A table the page draws (sortable): ``kinds`` say how each column sorts and prints."""

    title: str
    columns: list[str]
    kinds: list[Literal["text", "bytes", "int", "percent", "bool"]]
    rows: list[list[str | int | float | bool | None]]
    note: str | None
    link: Literal["oom"] | None  # "oom": row i is OOM id i (a click shows the state there)


class Baseline(TypedDict):
    name: str
    n: int
    bucket: int
    live: Column  # f32 max per bucket
    reserved: Column
    summary: list[list[str]]  # metric, this trace, baseline


class TraceInfo(TypedDict):
    name: str
    source: str
    device: int
    devices: list[int]
    device_name: str | None
    device_total: int | None
    events: int  # events of the reported device
    duration_s: float
    raw_device: bool


class Verdict(TypedDict):
    diagnosis: str | None
    explanation: str | None
    text: str  # one-line verdict


class Check(TypedDict):
    """One way the recommended setting's verdict was checked: ``how`` "replay" (or "model"), "device"
    (``advise --verify-on-device``), "real run" (``advise --rerun``); ``done`` False where it was not
    (``said`` then names the option that would)."""

    how: str
    done: bool
    said: str


class CureView(TypedDict):
    """One cure of the device budget (``tracekit.advise.candidates.Cure``): what is changed, the bytes it
    gives back and how that figure was had, when and how to do it; ``chosen``: part of the recommendation."""

    target: str
    returns_bytes: int
    how: str  # measured | estimated | derived
    when: str
    action: str
    chosen: bool


class Answer(TypedDict):
    """What to change, at the top of the page: advise's recommendation (``AdviseDict``), the line to
    paste, the verdict of the recommended setting (fits / borderline / none) with its headroom and
    the margin it had to exceed, and what verified it."""

    recommendation: str
    setting: str | None
    line: str | None
    verdict: str  # "fits", "borderline" or "none"
    headroom_bytes: int | None
    margin_bytes: int | None
    margin_why: str | None
    verified: str | None  # "replay", "model" (the device-allocator model); reruns add "real run"
    checks: list[Check]  # each way a verdict is had: the replay (or model), the device, a real run
    scope: str
    cures: list[CureView]  # the device ran out: every cure the budget shows, the recommended ones first
    whole_run: list[str]  # a run that died: record the whole run with room, then advise on it (or none)


class PageModel(TypedDict):
    version: int
    title: str
    trace: TraceInfo
    verdict: Verdict
    answer: Answer | None
    facts: list[list[str]]  # summary metric, value
    timeline: Timeline
    ooms: OOMColumns
    oom_groups: list[OOMGroup]
    oom_details: list[OOMDetail]
    peak: Peak
    frames: Frames
    stacks: Stacks
    user_code: list[str]  # the --user-code paths ([]: the frames of kind user are the user's code)
    label_rank: list[int]  # label ids (stacks.labels) by bytes x lifetime, largest first (first: palette)
    palette: list[str]
    state: State
    budget_start: Budget | None
    tables: list[TableView]
    baseline: Baseline | None
