/* tracekit report page: reads the JSON model (docs/report-page.md) and draws it.
   Every string from the trace goes into the page through textContent, never as markup. */
(function () {
  "use strict";
  const $ = (id) => document.getElementById(id);
  const M = JSON.parse($("model").textContent);
  const OP = { MALLOC: 0, FREE: 1, SEG_ALLOC: 2, SEG_FREE: 3, OOM: 4 };
  const T = { ready: false };
  window.tracekit = T;
  T.model = M;

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }

  /* ---------- units ---------- */
  function fmtBytes(n) {
    if (n === null || n === undefined || Number.isNaN(n)) return "n/a";
    const a = Math.abs(n), s = n < 0 ? "-" : "";
    if (a < 1024) return s + a.toFixed(0) + " B";
    const u = ["KiB", "MiB", "GiB", "TiB"];
    let v = a / 1024, i = 0;
    while (v >= 1024 && i < u.length - 1) { v /= 1024; i++; }
    return s + v.toFixed(2) + " " + u[i];
  }
  function fmtTime(ns) {
    if (ns === null || ns === undefined || ns < 0) return "n/a";
    if (ns < 1e6) return (ns / 1e3).toFixed(1) + " µs";
    if (ns < 1e9) return (ns / 1e6).toFixed(3) + " ms";
    return (ns / 1e9).toFixed(3) + " s";
  }
  const compact = (v) => (Math.abs(v) >= 1e6 ? +(v / 1e6).toFixed(2) + "M" : Math.abs(v) >= 1e4 ? +(v / 1e3).toFixed(1) + "k" : String(v));
  const hex = (a) => "0x" + Math.round(a).toString(16);

  /* ---------- columns: base64 -> inflate -> typed array (-> prefix sum) ---------- */
  const TYPES = { u8: Uint8Array, i32: Int32Array, f32: Float32Array, f64: Float64Array };
  function b64bytes(s) {
    if (Uint8Array.fromBase64) return Uint8Array.fromBase64(s);
    const bin = atob(s), out = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
    return out;
  }
  // One loop per array type, so each stays monomorphic (a shared loop over mixed types runs ~20x slower).
  function prefix64(a) { for (let i = 1; i < a.length; i++) a[i] += a[i - 1]; }
  function prefix32(a) { for (let i = 1; i < a.length; i++) a[i] += a[i - 1]; }
  async function decode(c) {
    const stream = new Blob([b64bytes(c.z)]).stream().pipeThrough(new DecompressionStream("deflate"));
    const buf = await new Response(stream).arrayBuffer();
    const a = new TYPES[c.dtype](buf);
    if (c.delta) (a instanceof Float64Array ? prefix64 : prefix32)(a);
    return a;
  }
  function columns(o, out) {
    if (o && typeof o === "object") {
      for (const k of Object.keys(o)) {
        const v = o[k];
        if (v && typeof v === "object" && typeof v.z === "string" && typeof v.dtype === "string") out.push([o, k]);
        else columns(v, out);
      }
    }
    return out;
  }
  async function decodeAll() {
    const slots = columns(M, []);
    const arrays = await Promise.all(slots.map(([o, k]) => decode(o[k])));
    slots.forEach(([o, k], i) => { o[k] = arrays[i]; });
  }

  /* ---------- call-sites ---------- */
  function frameText(f) {
    const F = M.frames;
    const line = F.line[f] >= 0 ? ":" + F.line[f] : "";
    return F.file[f] + line + (F.function[f] ? " in " + F.function[f] : "");
  }
  function stackLines(s) {
    const out = [];
    for (let i = 0; s >= 0 && i < 256; i++) { out.push(frameText(M.stacks.frame[s])); s = M.stacks.parent[s]; }
    return out;
  }
  /* The innermost frame of stack s that is the user's code (-1 none), as the analyzer found it. */
  const userFrame = (s) => (s >= 0 ? M.stacks.user_frame[s] : -1);
  /* A stack's call-site, the analyzer's label (tracekit.trace.callsite): computed in Python, shown here. */
  const labelOf = (s) => (s >= 0 ? M.stacks.label[s] : -1);
  function siteText(s) {
    const l = labelOf(s);
    return l >= 0 ? M.stacks.labels[l] : "(no call-site)";
  }
  /* Colours go to labels (one call-site, whatever stacks reach it), by bytes x lifetime. */
  const rankOf = new Map();
  let colourOf = null;
  function colours() {
    M.label_rank.forEach((l, i) => rankOf.set(l, i));
    const rgb = M.palette.map((h) => [parseInt(h.slice(1, 3), 16), parseInt(h.slice(3, 5), 16), parseInt(h.slice(5, 7), 16)]);
    colourOf = (s) => {
      const l = labelOf(s), r = l >= 0 ? rankOf.get(l) : undefined;
      if (r !== undefined && r < rgb.length) return rgb[r];
      return l < 0 ? [110, 110, 110] : [158, 158, 158];
    };
  }

  /* ---------- OOMs: columns, one row per OOM; details for the first ones ---------- */
  const details = new Map();
  let onDevIdx = [], onDevId = [];
  function initOOMs() {
    for (const d of M.oom_details) details.set(d.id, d);
    const O = M.ooms;
    for (let i = 0; i < O.count; i++) if (O.index[i] >= 0) { onDevIdx.push(O.index[i]); onDevId.push(i); }
  }
  function oom(id) {
    const O = M.ooms, d = details.get(id) || {};
    return { id, seq: O.seq[id], index: O.index[id], t_ns: O.t_ns[id], device: O.device[id], size: O.size[id],
      rounded: O.rounded[id], handled: O.handled[id] === 1, diagnosis: O.diagnoses[O.diagnosis[id]], stack: O.stack[id],
      live_bytes: O.live_bytes[id], reserved_bytes: O.reserved_bytes[id], largest_free_block: O.largest_free_block[id],
      device_free: O.device_free[id] >= 0 ? O.device_free[id] : null, explanation: d.explanation || null,
      handler: d.handler || null, budget: d.budget || null, reported: d.reported || null, reported_why: d.reported_why || null };
  }
  T.oom = oom;

  /* ---------- the allocator state at any event ---------- */
  const ST = {};
  function lowerBound(a, v) {
    let lo = 0, hi = a.length;
    while (lo < hi) { const m = (lo + hi) >>> 1; if (a[m] < v) lo = m + 1; else hi = m; }
    return lo;
  }
  const CHECKPOINT = 65536;
  function initState() {
    const S = M.state;
    ST.nb = S.blocks.addr.length;
    ST.ns = S.segments.addr.length;
    ST.live = new Uint8Array(ST.nb);
    ST.seg = new Uint8Array(ST.ns);
    ST.win = -1;
    ST.pos = -1; // events position applied so far (exclusive)
    ST.starts = S.windows.map((w) => w.start);
    ST.wpos = S.windows.map((w) => lowerBound(S.events.index, w.start));
    ST.checkpoints = S.windows.map(() => []);
    // Checkpoints inside long windows, so a jump backwards replays at most CHECKPOINT events.
    S.windows.forEach((w, wi) => {
      const a = ST.wpos[wi], b = lowerBound(S.events.index, w.end);
      if (b - a <= CHECKPOINT) return;
      reset(wi);
      for (let p = a; p < b; p += CHECKPOINT) {
        apply(p);
        ST.checkpoints[wi].push([p, ST.live.slice(), ST.seg.slice()]);
      }
    });
    ST.win = -1;
  }
  function reset(wi) {
    const K = M.state.keyframes;
    ST.live.fill(0); ST.seg.fill(0);
    for (let i = K.block_at[wi]; i < K.block_at[wi + 1]; i++) ST.live[K.blocks[i]] = 1;
    for (let i = K.segment_at[wi]; i < K.segment_at[wi + 1]; i++) ST.seg[K.segments[i]] = 1;
    ST.win = wi; ST.pos = ST.wpos[wi];
  }
  function apply(upto) { // apply kept events [ST.pos, upto)
    const op = M.state.events.op, ref = M.state.events.ref;
    for (let p = ST.pos; p < upto; p++) {
      const r = ref[p];
      if (r < 0) continue;
      switch (op[p]) {
        case OP.MALLOC: ST.live[r] = 1; break;
        case OP.FREE: ST.live[r] = 0; break;
        case OP.SEG_ALLOC: ST.seg[r] = 1; break;
        case OP.SEG_FREE: ST.seg[r] = 0; break;
      }
    }
    ST.pos = Math.max(ST.pos, upto);
  }
  /* The kept event nearest to index k (k itself inside a window). */
  function nearestKept(k) {
    const idx = M.state.events.index;
    if (!idx.length) return -1;
    const p = lowerBound(idx, k);
    if (p < idx.length && idx[p] === k) return k;
    const a = p > 0 ? idx[p - 1] : Infinity, b = p < idx.length ? idx[p] : Infinity;
    return Math.abs(k - a) <= Math.abs(b - k) ? a : b;
  }
  /* Blocks and segments live right after event k (k must be kept). */
  function stateAfter(k) {
    const S = M.state, idx = S.events.index;
    const p = lowerBound(idx, k); // position of event k
    let wi = lowerBound(ST.starts, k + 1) - 1;
    if (wi < 0) wi = 0;
    if (ST.win !== wi || ST.pos > p + 1) {
      const cps = ST.checkpoints[wi];
      let best = null;
      for (const c of cps) if (c[0] <= p + 1) best = c;
      if (best) { ST.live.set(best[1]); ST.seg.set(best[2]); ST.win = wi; ST.pos = best[0]; }
      else reset(wi);
    }
    apply(p + 1);
    const blocks = [], segs = [];
    for (let i = 0; i < ST.nb; i++) if (ST.live[i]) blocks.push(i);
    for (let i = 0; i < ST.ns; i++) if (ST.seg[i]) segs.push(i);
    return { index: k, pos: p, blocks, segs };
  }
  T.stateAfter = stateAfter;

  /* ---------- memory map ---------- */
  const MAP = { rows: 24, rowH: 12, width: 1200 };
  let view = null;
  function layout(st) {
    const B = M.state.blocks, G = M.state.segments;
    let segs;
    if (M.state.pooled) segs = st.segs.map((s) => ({ id: s, addr: G.addr[s], size: G.size[s] }));
    else segs = st.blocks.map((b) => ({ id: -1, block: b, addr: B.addr[b], size: B.rounded[b] }));
    segs.sort((a, b) => a.addr - b.addr);
    let off = 0;
    for (const s of segs) { s.off = off; off += s.size; }
    const total = Math.max(off, 1);
    const cells = MAP.rows * MAP.width;
    const bpp = total / cells;
    const segAddr = segs.map((s) => s.addr);
    // Each live block's offset on the strip: its segment's offset + (address - segment address).
    const placed = [];
    for (const b of st.blocks) {
      let g = lowerBound(segAddr, B.addr[b] + 1) - 1;
      if (g < 0) continue;
      const s = segs[g];
      if (B.addr[b] >= s.addr + s.size) continue;
      placed.push({ b, off: s.off + (B.addr[b] - s.addr), len: B.rounded[b], seg: g });
    }
    placed.sort((x, y) => x.off - y.off);
    // Free gaps inside each segment, and the largest.
    let largest = { off: 0, len: 0, seg: -1 };
    let pi = 0;
    for (let g = 0; g < segs.length; g++) {
      const s = segs[g];
      let cur = s.off;
      while (pi < placed.length && placed[pi].seg === g) {
        const p = placed[pi];
        if (p.off - cur > largest.len) largest = { off: cur, len: p.off - cur, seg: g };
        cur = Math.max(cur, p.off + p.len);
        pi++;
      }
      if (s.off + s.size - cur > largest.len) largest = { off: cur, len: s.off + s.size - cur, seg: g };
    }
    if (!M.state.pooled) largest = { off: 0, len: 0, seg: -1 };
    return { segs, placed, total, bpp, largest, offsets: placed.map((p) => p.off) };
  }
  function cellRange(off, len, bpp) {
    const a = Math.floor(off / bpp);
    const b = Math.max(a + 1, Math.ceil((off + len) / bpp));
    return [a, b];
  }
  function drawMap(st) {
    const cv = $("map");
    const L = layout(st);
    const H = MAP.rows * MAP.rowH;
    if (cv.width !== MAP.width) cv.width = MAP.width;
    if (cv.height !== H) cv.height = H;
    const ctx = cv.getContext("2d");
    const img = ctx.createImageData(MAP.width, H);
    const cells = MAP.rows * MAP.width;
    const colour = new Uint8Array(cells * 3).fill(255);
    const paint = (a, b, c) => {
      for (let i = Math.max(a, 0); i < Math.min(b, cells); i++) { colour[3 * i] = c[0]; colour[3 * i + 1] = c[1]; colour[3 * i + 2] = c[2]; }
    };
    const FREE = [214, 240, 214];
    for (const s of L.segs) { const [a, b] = cellRange(s.off, s.size, L.bpp); paint(a, b, FREE); }
    const stackCol = M.state.blocks.stack;
    for (const p of L.placed) { const [a, b] = cellRange(p.off, p.len, L.bpp); paint(a, b, colourOf(stackCol[p.b])); }
    const d = img.data;
    for (let r = 0; r < MAP.rows; r++) {
      for (let x = 0; x < MAP.width; x++) {
        const c = r * MAP.width + x;
        for (let y = 1; y < MAP.rowH; y++) { // one white line between rows
          const o = ((r * MAP.rowH + y) * MAP.width + x) * 4;
          d[o] = colour[3 * c]; d[o + 1] = colour[3 * c + 1]; d[o + 2] = colour[3 * c + 2]; d[o + 3] = 255;
        }
        const o = (r * MAP.rowH * MAP.width + x) * 4;
        d[o] = d[o + 1] = d[o + 2] = d[o + 3] = 255;
      }
    }
    ctx.putImageData(img, 0, 0);
    // Segment boundaries as dark ticks, the largest free block outlined.
    ctx.fillStyle = "#333";
    for (const s of L.segs) {
      const c = Math.floor(s.off / L.bpp);
      ctx.fillRect(c % MAP.width, Math.floor(c / MAP.width) * MAP.rowH, 1, MAP.rowH);
    }
    if (L.largest.len > 0) outline(ctx, L.largest.off, L.largest.len, L.bpp, "#000", 2);
    view = { st, L };
    T.view = { index: st.index, blocks: st.blocks, segments: st.segs, largest: L.largest.len, bpp: L.bpp };
    return L;
  }
  function outline(ctx, off, len, bpp, colour, w) {
    ctx.strokeStyle = colour; ctx.lineWidth = w;
    const [a, b] = cellRange(off, len, bpp);
    for (let r = Math.floor(a / MAP.width); r <= Math.floor((b - 1) / MAP.width) && r < MAP.rows; r++) {
      const x0 = r === Math.floor(a / MAP.width) ? a % MAP.width : 0;
      const x1 = r === Math.floor((b - 1) / MAP.width) ? ((b - 1) % MAP.width) + 1 : MAP.width;
      ctx.strokeRect(x0 + 0.5, r * MAP.rowH + 1.5, Math.max(x1 - x0 - 1, 1), MAP.rowH - 2);
    }
  }
  function drawRequest(oom, L) {
    const box = $("request"), cv = $("request-bar");
    box.replaceChildren();
    cv.hidden = !oom;
    if (!oom) return;
    const p = el("p", "req");
    p.append(el("b", null, (oom.handled ? "Handled" : "Fatal") + " OOM: "),
      el("span", null, "request " + fmtBytes(oom.rounded) + " (" + oom.rounded.toLocaleString() + " B; asked " +
        fmtBytes(oom.size) + ") against the largest free block " + fmtBytes(L.largest.len) +
        " at this event (analyzer: " + fmtBytes(oom.largest_free_block) + "); diagnosis: " + oom.diagnosis +
        "; call-site: " + siteText(oom.stack)));
    box.append(p);
    if (oom.reported) {  // the program's own error, beside the recorded size, and why they differ
      const r = el("p", "reported");
      r.append(el("span", null, "The program's error: "), el("q", null, oom.reported),
        el("span", null, oom.reported_why ? " (" + oom.reported_why + ")." : " (the recorded request)."));
      box.append(r);
    }
    // The reported OOM's explanation is the page's second line already; another OOM's is said here.
    if (oom.explanation && oom.explanation !== M.verdict.explanation) box.append(el("p", "help", oom.explanation));
    // The request at the map's scale: bytes per pixel as above, wrapped the same way.
    const cells = Math.max(1, Math.ceil(oom.rounded / L.bpp));
    const rows = Math.min(MAP.rows, Math.ceil(cells / MAP.width));
    const cap = el("p", "help request-caption");
    cap.append(el("span", "sw sw-request"), el("span", null, " Below, in black: the failing request, " + fmtBytes(oom.rounded) +
      ", at the map's scale (one cell = " + fmtBytes(L.bpp) + "). It needs one free piece at least this long; the " +
      "largest free block, outlined on the map, is " + fmtBytes(L.largest.len) + "."));
    box.append(cap);
    if (cells > MAP.rows * MAP.width) box.append(el("p", "help", "The request is larger than every segment together; drawn cut."));
    if (cv.height !== rows * MAP.rowH) cv.height = rows * MAP.rowH;
    const ctx = cv.getContext("2d");
    ctx.clearRect(0, 0, cv.width, cv.height);
    ctx.fillStyle = "#111";
    for (let r = 0; r < rows; r++) ctx.fillRect(0, r * MAP.rowH + 1, Math.min(MAP.width, cells - r * MAP.width), MAP.rowH - 2);
  }
  function mapHit(ev) {
    if (!view) return null;
    const cv = $("map"), r = cv.getBoundingClientRect();
    const x = Math.floor((ev.clientX - r.left) * cv.width / r.width), y = Math.floor((ev.clientY - r.top) * cv.height / r.height);
    const row = Math.floor(y / MAP.rowH);
    if (x < 0 || x >= MAP.width || row < 0 || row >= MAP.rows) return null;
    const L = view.L, off = (row * MAP.width + x + 0.5) * L.bpp;
    const pi = lowerBound(L.offsets, off + 1) - 1;
    if (pi >= 0) {
      const p = L.placed[pi];
      if (off < p.off + Math.max(p.len, L.bpp)) return { block: p.b };
    }
    const g = lowerBound(L.segs.map((s) => s.off), off + 1) - 1;
    if (g >= 0 && off < L.segs[g].off + L.segs[g].size) return { seg: L.segs[g] };
    return null;
  }
  T.locate = function (blockId) { // css pixel (x, y) of a live block on the map, for the tests
    if (!view) return null;
    const p = view.L.placed.find((q) => q.b === blockId);
    if (!p) return null;
    const [a, b] = cellRange(p.off, p.len, view.L.bpp);
    const c = Math.floor((a + b - 1) / 2);
    const cv = $("map"), r = cv.getBoundingClientRect();
    return { x: r.left + ((c % MAP.width) + 0.5) * r.width / cv.width,
      y: r.top + (Math.floor(c / MAP.width) * MAP.rowH + MAP.rowH / 2) * r.height / cv.height };
  };
  function blockTip(b) {
    const B = M.state.blocks;
    const lines = ["block " + hex(B.addr[b]) + ": " + fmtBytes(B.size[b]) + " requested, " + fmtBytes(B.rounded[b]) + " rounded"];
    const st = stackLines(B.stack[b]);
    lines.push("call-site: " + siteText(B.stack[b]));
    if (st.length) lines.push("  at " + st[0]);
    for (const s of st.slice(1)) lines.push("  from " + s);
    const mine = userFrame(B.stack[b]);
    if (mine >= 0 && st.length > 1) lines.push("your code: " + frameText(mine));
    lines.push("malloc: seq " + B.malloc_seq[b] + " at " + fmtTime(B.malloc_t[b]));
    lines.push(B.free[b] >= 0 ? "free: seq " + B.free_seq[b] + " at " + fmtTime(B.free_t[b]) : "never freed");
    if (B.segment[b] >= 0) lines.push("in segment " + hex(M.state.segments.addr[B.segment[b]]));
    return lines;
  }
  T.blockTip = (b) => blockTip(b);
  function segTip(s) {
    const G = M.state.segments;
    if (s.id < 0) return ["(no segment)"];
    const i = s.id;
    return ["segment " + hex(G.addr[i]) + ": " + fmtBytes(G.size[i]),
      "taken: seq " + G.alloc_seq[i] + " at " + fmtTime(G.alloc_t[i]),
      G.free[i] >= 0 ? "released: seq " + G.free_seq[i] + " at " + fmtTime(G.free_t[i]) : "never released",
      "free space here is pale green"];
  }
  const tip = $("tip");
  const TIP_LINES = 40; // a deeper stack is cut in the middle: its innermost and outermost frames stay
  /* The tooltip beside the pointer, kept inside the window: to the right and below, flipped to the left or
     above where it would cross the edge, clamped to the window (and cut to its height) where neither fits. */
  function showTip(lines, x, y) {
    if (lines.length > TIP_LINES) {
      const cut = lines.length - TIP_LINES + 1, keep = TIP_LINES - 4;
      lines = lines.slice(0, keep).concat(["  … " + cut.toLocaleString() + " more frames …"], lines.slice(lines.length - 3));
    }
    tip.replaceChildren(...lines.map((l) => el("div", null, l)));
    tip.hidden = false;
    const W = document.documentElement.clientWidth, H = document.documentElement.clientHeight, gap = 14, edge = 4;
    tip.style.maxHeight = (H - 2 * edge) + "px";
    tip.style.left = "0px"; tip.style.top = "0px";
    const w = tip.offsetWidth, h = tip.offsetHeight;
    let left = x + gap, top = y + gap;
    if (left + w > W - edge) left = x - gap - w;
    if (top + h > H - edge) top = y - gap - h;
    left = Math.max(edge, Math.min(left, W - edge - w));
    top = Math.max(edge, Math.min(top, H - edge - h));
    tip.style.left = left + "px";
    tip.style.top = top + "px";
  }
  const hideTip = () => { tip.hidden = true; };

  /* ---------- selecting an event ---------- */
  let current = -1;
  let FL = null; // the flame graph (flame.js)
  let plot = null;
  function eventFacts(k) {
    const E = M.state.events, p = lowerBound(E.index, k);
    return { seq: E.seq[p], t: E.t_ns[p], op: E.op[p], ref: E.ref[p] };
  }
  const OPNAMES = ["malloc", "free", "segment_alloc", "segment_free", "oom"];
  function select(k) {
    const n = M.timeline.n;
    if (!n || !M.state.events.index.length) return;
    k = Math.max(0, Math.min(n - 1, Math.round(k)));
    const kept = nearestKept(k);
    const st = stateAfter(kept);
    current = kept;
    const L = drawMap(st);
    const f = eventFacts(kept);
    const o = f.op === OP.OOM && f.ref >= 0 ? oom(f.ref) : null;
    drawRequest(o, L);
    if (FL) FL.draw(st, { oom: o, when: whenText(kept, f, o) });
    $("scrub").value = String(kept);
    $("scrub-seq").value = String(f.seq);
    $("at").textContent = "event " + kept.toLocaleString() + ", seq " + f.seq + " (" + OPNAMES[f.op] + ") at " +
      fmtTime(f.t) + ": " + st.blocks.length.toLocaleString() + " live blocks in " +
      (M.state.pooled ? st.segs.length.toLocaleString() + " segments" : "no segments (raw device)") +
      ", largest free block " + fmtBytes(L.largest.len) + (kept !== k ? " (nearest kept event to " + k + ")" : "");
    $("at").dataset.seq = String(f.seq);
    if (o) showBudget(o);
    placeCurrent();
  }
  T.select = select;
  function whenText(k, f, o) {
    const at = "after event " + k.toLocaleString() + " (seq " + f.seq + ")";
    if (o) return "at the " + (o.handled ? "handled" : "fatal") + " OOM, " + at;
    if (k === M.peak.live_index) return "at the peak of live bytes, " + at;
    if (k === M.timeline.n - 1) return "at the end (never freed), " + at;
    return at;
  }
  /* The next (d = 1) or previous (d = -1) OOM of the drawn device from the selected event. */
  function stepOOM(d) {
    if (!onDevIdx.length) return;
    let j = d > 0 ? lowerBound(onDevIdx, current + 1) : lowerBound(onDevIdx, current) - 1;
    j = Math.max(0, Math.min(onDevIdx.length - 1, j));
    T.selectOOM(onDevId[j]);
  }
  T.stepOOM = stepOOM;
  T.selectSeq = function (seq) {
    const E = M.state.events;
    let p = lowerBound(E.seq, seq);
    if (p >= E.seq.length) p = E.seq.length - 1;
    select(E.index[p]);
  };
  T.selectOOM = function (id) { if (id >= 0 && id < M.ooms.count && M.ooms.index[id] >= 0) select(M.ooms.index[id]); };

  /* ---------- timeline ---------- */
  /* Every mark has a legend entry (timelineLegend): the pool's curves on the left axis (MiB), device free on
     its own right axis (scaled to its own range, so a drop of a few GiB in 140 shows), fragmentation in a
     strip below in a muted colour (high is common and no alarm by itself), the pool limit a dashed line with
     its figure, each OOM a line with a head above the plot (fatal: red triangle; handled: grey circle), the
     failing request a black bar on the reserved bytes, the peak a triangle, the selected event a purple line. */
  const COL = { requested: "#17becf", live: "#1f77b4", reserved: "#ff7f0e", largest_free: "#2ca02c",
    device_free: "#6d6d6d", frag: "#6b7b8c", measured: "#444444", limit: "#000000", fatal: "#d00000",
    handled: "#808080", request: "#111111", peak: "#1f77b4", selected: "#6a3d9a" };
  const MiB = 1048576, GiB = 1073741824, HEAD = 26;
  let DEV = MiB; // the device-free axis's unit: GiB past 10 GiB // css px above the plot where the OOM markers' heads are drawn
  const TL = M.timeline;
  const MAIN = TL.series.filter((s) => s.axis !== "frag"), FRAG = TL.series.filter((s) => s.axis === "frag");
  let level = -1, strip = null, stripLine = null;
  const plural = (n, w, ws) => n.toLocaleString() + " " + (n === 1 ? w : ws || w + "s");
  const limitText = () => (TL.limit_what || "pool limit") + " " + fmtBytes(TL.limit_bytes);
  /* Per series two uPlot series, the bucket maximum (the line) and minimum, filled between as a band:
     a filled band draws in a few ms where a zigzag through both would stroke thousands of tall segments. */
  function levelData(li) {
    const lv = TL.levels[li], b = lv.bucket;
    const x = new Float64Array(lv.count);
    for (let i = 0; i < lv.count; i++) x[i] = i * b;
    const ys = (list) => {
      const out = [];
      for (const s of list) {
        const scale = s.unit === "percent" ? 1 : s.axis === "device" ? 1 / DEV : 1 / MiB;
        for (const col of [lv.hi[s.key], lv.lo[s.key]]) {
          const y = new Array(lv.count);
          for (let i = 0; i < lv.count; i++) y[i] = Number.isNaN(col[i]) ? null : col[i] * scale;
          out.push(y);
        }
      }
      return out;
    };
    return { main: [x, ...ys(MAIN)], frag: FRAG.length ? [x, ...ys(FRAG)] : null };
  }
  function pickLevel(a, b) {
    const w = Math.max(plot ? plot.bbox.width / devicePixelRatio : 1000, 200);
    for (let i = TL.levels.length - 1; i >= 0; i--) {
      // The finest level with at most one bucket per two pixels: the band keeps every minimum and
      // maximum, and software rasterizing of a jagged path costs with its vertices.
      if ((b - a) / TL.levels[i].bucket <= w / 2) return i;
    }
    return 0;
  }
  const cache = new Map();
  function zoomTo(a, b) {
    const n = TL.n;
    let span = Math.max(b - a, Math.min(20, n));
    a = Math.max(0, Math.min(a, n - span)); b = Math.min(n, a + span);
    const li = pickLevel(a, b);
    if (li !== level) {
      if (!cache.has(li)) cache.set(li, levelData(li));
      level = li;
      plot.setData(cache.get(li).main, false);
      if (strip) strip.setData(cache.get(li).frag, false);
    }
    plot.setScale("x", { min: a, max: b });
    if (strip) strip.setScale("x", { min: a, max: b });
  }
  T.zoom = zoomTo;
  /* The device-free axis (bytes): the measured points and the derived curve, padded; from 0 where the
     range is wide, else around the values, so a drop of a few GiB in 140 GiB shows. */
  function deviceRange() {
    let lo = Infinity, hi = -Infinity;
    const see = (v) => { if (!Number.isNaN(v)) { lo = Math.min(lo, v); hi = Math.max(hi, v); } };
    if (TL.measured_free) for (const v of TL.measured_free.bytes) see(v);
    const lv = TL.levels[0];
    for (const s of MAIN) if (s.axis === "device") { for (const v of lv.lo[s.key]) see(v); for (const v of lv.hi[s.key]) see(v); }
    if (!(hi >= lo)) return [0, MiB];
    const pad = Math.max((hi - lo) * 0.12, hi * 0.005, MiB);
    return [lo - pad < (hi - lo) ? 0 : lo - pad, hi + pad];
  }
  /* The pool axis: up to the highest curve, the limit, and the failing requests' tops. */
  let poolTop = 0;
  function poolExtras() {
    let top = TL.limit_bytes ? TL.limit_bytes / MiB : 0;
    for (const id of onDevId) if (M.ooms.handled[id] === 0) top = Math.max(top, (M.ooms.reserved_bytes[id] + M.ooms.rounded[id]) / MiB);
    return top;
  }
  const fatalAt = [], handledAt = []; // canvas pixels of the OOM heads drawn last (T.fatalMarks: client pixels)
  function markers(u) {
    const ctx = u.ctx, dpr = devicePixelRatio, top = u.bbox.top, h = u.bbox.height, left = u.bbox.left, w = u.bbox.width;
    const X = (v) => u.valToPos(v, "x", true);
    ctx.save();
    ctx.beginPath(); ctx.rect(left - 8 * dpr, 0, w + 16 * dpr, top + h); ctx.clip();
    ctx.font = Math.round(11 * dpr) + "px system-ui, sans-serif";
    const halo = (text, x, y) => { ctx.lineWidth = 3 * dpr; ctx.strokeStyle = "rgba(255,255,255,0.9)"; ctx.strokeText(text, x, y); ctx.fillText(text, x, y); };
    if (TL.limit_bytes) {
      const y = u.valToPos(TL.limit_bytes / MiB, "y", true);
      ctx.strokeStyle = COL.limit; ctx.lineWidth = 1.2 * dpr; ctx.setLineDash([7 * dpr, 4 * dpr]);
      ctx.beginPath(); ctx.moveTo(left, y); ctx.lineTo(left + w, y); ctx.stroke(); ctx.setLineDash([]);
      ctx.fillStyle = COL.limit; ctx.textAlign = "left"; ctx.textBaseline = "bottom";
      halo(limitText(), left + 6 * dpr, y - 2 * dpr);
    }
    if (TL.measured_free) {
      ctx.fillStyle = COL.measured;
      const I = TL.measured_free.index, V = TL.measured_free.bytes;
      const a = lowerBound(I, u.scales.x.min), b = lowerBound(I, u.scales.x.max + 1);
      for (let i = a; i < b && i < a + 20000; i++) {
        ctx.beginPath(); ctx.arc(X(I[i]), u.valToPos(V[i] / DEV, "dev", true), 3 * dpr, 0, 7); ctx.fill();
      }
    }
    const pk = M.peak;
    if (pk.live_index !== null) {
      const x = X(pk.live_index), y = u.valToPos(pk.live_bytes / MiB, "y", true);
      ctx.fillStyle = COL.peak; ctx.beginPath(); ctx.moveTo(x, y - 4 * dpr); ctx.lineTo(x - 6 * dpr, y - 14 * dpr); ctx.lineTo(x + 6 * dpr, y - 14 * dpr); ctx.fill();
    }
    const a = lowerBound(onDevIdx, u.scales.x.min), b = lowerBound(onDevIdx, u.scales.x.max + 1);
    const stride = Math.max(1, Math.ceil((b - a) / 4000)); // at most 4,000 marks a frame; the fatal ones always
    const headY = top - HEAD * dpr / 2, fatal = [];
    ctx.strokeStyle = COL.handled; ctx.lineWidth = dpr; ctx.setLineDash([4 * dpr, 4 * dpr]);
    ctx.beginPath();
    const handled = [];
    for (let j = a; j < b; j++) {
      const id = onDevId[j];
      if (M.ooms.handled[id] === 0) { fatal.push(id); continue; }
      if ((j - a) % stride !== 0) continue;
      const x = X(M.ooms.index[id]);
      handled.push(x);
      ctx.moveTo(x, headY + 5 * dpr); ctx.lineTo(x, top + h);
    }
    ctx.stroke(); ctx.setLineDash([]);
    ctx.fillStyle = "#fff"; ctx.lineWidth = 1.5 * dpr;
    handledAt.length = 0;
    for (const x of handled) { ctx.beginPath(); ctx.arc(x, headY, 4.5 * dpr, 0, 7); ctx.fill(); ctx.stroke(); handledAt.push([x, headY]); }
    fatalAt.length = 0;
    for (const id of fatal) {
      const x = X(M.ooms.index[id]);
      ctx.strokeStyle = COL.fatal; ctx.lineWidth = 2 * dpr;
      ctx.beginPath(); ctx.moveTo(x, headY); ctx.lineTo(x, top + h); ctx.stroke();
      ctx.fillStyle = COL.fatal; ctx.beginPath();  // the head: a red triangle above the plot, never under the selection
      ctx.moveTo(x - 8 * dpr, headY - 8 * dpr); ctx.lineTo(x + 8 * dpr, headY - 8 * dpr); ctx.lineTo(x, headY + 7 * dpr); ctx.fill();
      ctx.textBaseline = "middle";
      const right = x + 12 * dpr + ctx.measureText("fatal OOM").width < left + w;
      ctx.textAlign = right ? "left" : "right";
      ctx.fillStyle = COL.fatal; ctx.fillText("fatal OOM", right ? x + 11 * dpr : x - 11 * dpr, headY - 1 * dpr);
      // the failing request stacked on the reserved bytes at that moment
      const y0 = u.valToPos(M.ooms.reserved_bytes[id] / MiB, "y", true), y1 = u.valToPos((M.ooms.reserved_bytes[id] + M.ooms.rounded[id]) / MiB, "y", true);
      ctx.fillStyle = COL.request; ctx.fillRect(x - 3 * dpr, Math.min(y0, y1), 6 * dpr, Math.max(Math.abs(y0 - y1), 2 * dpr));
      ctx.textAlign = "right"; ctx.textBaseline = "middle"; ctx.fillStyle = COL.request;
      halo("request " + fmtBytes(M.ooms.rounded[id]), x - 7 * dpr, (y0 + y1) / 2);
      fatalAt.push([x, headY]);
    }
    ctx.restore();
  }
  /* Where the fatal OOMs' heads are, in client pixels (the tests look there). */
  function marksAt(at) {
    if (!plot) return [];
    const r = plot.ctx.canvas.getBoundingClientRect(), dpr = devicePixelRatio;
    return at.map(([x, y]) => ({ x: r.left + x / dpr, y: r.top + y / dpr }));
  }
  T.fatalMarks = () => marksAt(fatalAt);
  T.handledMarks = () => marksAt(handledAt);
  /* The selected event: a line element over each plot, so selecting an event moves one element
     instead of redrawing (and rasterizing) every curve. */
  let currentLine = null;
  function placeCurrent() {
    for (const [u, line] of [[plot, currentLine], [strip, stripLine]]) {
      if (!u || !line) continue;
      const x = current >= 0 ? u.valToPos(current, "x") : -1;
      line.hidden = !(x >= 0 && x <= u.over.clientWidth);
      line.style.left = Math.round(x - 1) + "px";
    }
  }
  function curveTip(u) {
    const i = u.cursor.idx;
    if (i === null || i === undefined || u.cursor.left < 0) { hideTip(); return; }
    const lv = TL.levels[level], b = lv.bucket, bi = i;
    const k0 = bi * b, k1 = Math.min((bi + 1) * b, TL.n) - 1;
    const fine = TL.levels[TL.levels.length - 1].bucket, fi = Math.floor(k0 / fine);
    const lines = [b > 1 ? "events " + k0.toLocaleString() + "–" + k1.toLocaleString() + " (min..max)" :
      "event " + k0.toLocaleString()];
    lines.push((fine > 1 ? "from seq " : "seq ") + TL.seq[fi] + " at " + fmtTime(TL.t_ns[fi]));
    TL.series.forEach((s) => {
      const lo = lv.lo[s.key][bi], hi = lv.hi[s.key][bi];
      if (Number.isNaN(hi)) return;
      const f = s.unit === "percent" ? (v) => v.toFixed(1) + "%" : fmtBytes;
      lines.push(s.label + ": " + (lo === hi ? f(hi) : f(lo) + " .. " + f(hi)));
    });
    if (TL.measured_free) {
      const I = TL.measured_free.index, p = lowerBound(I, k1 + 1) - 1;
      if (p >= 0) lines.push("device free, measured at event " + I[p].toLocaleString() + ": " + fmtBytes(TL.measured_free.bytes[p]));
    }
    const r = u.over.getBoundingClientRect();
    showTip(lines, r.left + u.cursor.left, r.top + u.cursor.top);
  }
  /* Drag to zoom, click to select, wheel to zoom at the pointer, double-click to reset: on both plots. */
  function interact(u) {
    const over = u.over;
    let down = null;
    over.addEventListener("mousedown", (e) => { down = [e.clientX, e.clientY]; });
    over.addEventListener("click", (e) => {
      if (down && Math.abs(e.clientX - down[0]) + Math.abs(e.clientY - down[1]) > 4) return; // a drag, not a click
      const r = over.getBoundingClientRect();
      select(u.posToVal(e.clientX - r.left, "x"));
    });
    over.addEventListener("mouseleave", hideTip);
    over.addEventListener("dblclick", () => zoomTo(0, TL.n));
    over.addEventListener("wheel", (e) => {
      e.preventDefault();
      const r = over.getBoundingClientRect();
      const at = u.posToVal(e.clientX - r.left, "x");
      const { min, max } = u.scales.x, f = e.deltaY < 0 ? 0.8 : 1.25;
      zoomTo(at - (at - min) * f, at + (max - at) * f);
    }, { passive: false });
  }
  const dragZoom = (u) => {
    if (u.select.width > 4) zoomTo(u.posToVal(u.select.left, "x"), u.posToVal(u.select.left + u.select.width, "x"));
    u.setSelect({ left: 0, top: 0, width: 0, height: 0 }, false);
  };
  const hasDev = () => !!TL.measured_free || MAIN.some((s) => s.axis === "device");
  function buildTimeline() {
    const box = $("timeline");
    const width = Math.max(600, Math.min(1400, box.clientWidth || 1200));
    const dev = hasDev();
    const series = [{ label: "event" }], bands = [];
    for (const s of MAIN) {
      const common = { stroke: COL[s.key] || "#000", scale: s.axis === "device" ? "dev" : "y",
        dash: s.key === "device_free" ? [4, 3] : undefined, points: { show: false } };
      series.push({ ...common, label: s.label, width: s.key === "live" ? 1.6 : 1.1 });
      series.push({ ...common, label: s.label + " (bucket minimum)", width: 0.6 });
      bands.push({ series: [series.length - 2, series.length - 1], fill: (COL[s.key] || "#000000") + "38" });
    }
    poolTop = poolExtras();
    const bytes = deviceRange();
    DEV = bytes[1] > 10 * GiB ? GiB : MiB;
    T.devUnit = DEV;
    const range = [bytes[0] / DEV, bytes[1] / DEV];
    const right = dev ? [{ side: 1, scale: "dev", label: "device free (" + (DEV === GiB ? "GiB" : "MiB") + ")", size: 78,
      grid: { show: false }, stroke: COL.device_free }] : [];
    const opts = {
      width, height: 360, series, bands, padding: [onDevId.length ? HEAD + 6 : 12, 12, 0, 0],
      scales: { x: { time: false }, y: { range: (u, lo, hi) => [0, Math.max(hi, poolTop) * 1.08 || 1] },
        dev: { range } },
      axes: [{ label: FRAG.length ? null : "event index", values: (u, vals) => vals.map(compact) },
        { label: "memory (MiB)", size: 78, scale: "y" }, ...right],
      cursor: { drag: { x: true, y: false, setScale: false }, points: { show: false } },
      legend: { show: false },
      hooks: { draw: [markers, placeCurrent], setCursor: [curveTip], setSelect: [dragZoom] },
    };
    if (!dev) delete opts.scales.dev;
    level = 0;
    cache.set(0, levelData(0));
    plot = new uPlot(opts, cache.get(0).main, box);
    T.plot = plot;
    currentLine = el("div", "current-line");
    currentLine.hidden = true;
    plot.over.append(currentLine);
    interact(plot);
    if (FRAG.length) {
      const sbox = $("frag-strip");
      sbox.hidden = false;
      const s = FRAG[0];
      const sopts = {
        width, height: 130, padding: [8, 12, 0, 0],
        series: [{ label: "event" }, { label: s.label, stroke: COL.frag, width: 1, scale: "%", points: { show: false } },
          { label: s.label + " (bucket minimum)", stroke: COL.frag, width: 0.5, scale: "%", points: { show: false } }],
        bands: [{ series: [1, 2], fill: COL.frag + "26" }],
        scales: { x: { time: false }, "%": { range: [0, 100] } },
        axes: [{ label: "event index", values: (u, vals) => vals.map(compact) },
          { label: "fragm. %", size: 78, scale: "%", values: (u, vals) => vals.map((v) => v + "%"), splits: () => [0, 50, 100] },
          ...(dev ? [{ side: 1, scale: "%", size: 78, label: " ", values: (u, vals) => vals.map(() => ""), grid: { show: false }, ticks: { show: false } }] : [])],
        cursor: { drag: { x: true, y: false, setScale: false }, points: { show: false } },
        legend: { show: false },
        hooks: { draw: [placeCurrent], setCursor: [curveTip], setSelect: [dragZoom] },
      };
      strip = new uPlot(sopts, cache.get(0).frag, sbox);
      T.strip = strip;
      stripLine = el("div", "current-line");
      stripLine.hidden = true;
      strip.over.append(stripLine);
      interact(strip);
    }
    $("tl-legend").replaceChildren(...timelineLegend());
    zoomTo(0, TL.n);
  }
  /* One legend entry per series and per mark the timeline draws (data-key: the series key or the mark). */
  function timelineLegend() {
    const out = [];
    const add = (key, sw, text, help) => {
      const item = el("span", "litem");
      item.dataset.key = key;
      if (help) item.title = help;
      item.append(sw, el("span", null, text));
      out.push(item);
    };
    const line = (colour, style, width) => { const s = el("span", "sw-line"); s.style.borderTopColor = colour; s.style.borderTopStyle = style || "solid"; s.style.borderTopWidth = (width || 2) + "px"; return s; };
    const glyph = (text, colour, cls) => { const s = el("span", "sw-glyph" + (cls ? " " + cls : ""), text); s.style.color = colour; return s; };
    const band = (colour) => { const s = el("span", "sw-band"); s.style.background = colour + "40"; s.style.borderTopColor = colour; return s; };
    for (const s of TL.series) {
      const sw = s.axis === "frag" ? band(COL.frag) : line(COL[s.key] || "#000", s.key === "device_free" ? "dashed" : "solid");
      add(s.key, sw, s.label, s.help + ". The shaded band is the minimum..maximum within a bucket of events.");
    }
    if (TL.measured_free) add("measured_free", glyph("●", COL.measured), "device free, measured (right axis)",
      "cudaMemGetInfo where the recorder measured it: at the pool's device allocations and at OOMs");
    if (TL.limit_bytes) add("limit", line(COL.limit, "dashed", 2), limitText(),
      "the cap the pool may not grow past (" + TL.limit_bytes.toLocaleString() + " bytes)");
    let fatal = 0, handled = 0;
    for (const id of onDevId) { if (M.ooms.handled[id]) handled++; else fatal++; }
    if (fatal) {
      add("fatal", glyph("▼", COL.fatal, "g-fatal"), "fatal OOM (the program died of it)", "a red line with a red triangle above the plot");
      add("request", el("span", "sw sw-request"), "the failing request, stacked on the reserved bytes",
        "a black bar as tall as the request, from the reserved bytes at that moment: above the limit line, it could not fit");
    }
    if (handled) add("handled", glyph("○", COL.handled, "g-handled"), "handled OOM (the program went on)", "a grey dashed line with a grey circle above the plot");
    if (M.peak.live_index !== null) add("peak", glyph("▼", COL.peak), "peak of live bytes", "seq " + M.peak.live_seq);
    add("selected", line(COL.selected, "solid", 2), "selected event (the allocator state below)", "click the timeline to move it");
    return out;
  }
  function keys(e) {
    if (e.target && (e.target.tagName === "INPUT" && e.target.type === "number")) return;
    if (!plot) return;
    const { min, max } = plot.scales.x, span = max - min;
    if (e.key === "+" || e.key === "=") zoomTo(min + span * 0.2, max - span * 0.2);
    else if (e.key === "-") zoomTo(min - span * 0.25, max + span * 0.25);
    else if (e.key === "0") zoomTo(0, TL.n);
    else if (e.key === "ArrowLeft" && e.shiftKey) zoomTo(min - span * 0.2, max - span * 0.2);
    else if (e.key === "ArrowRight" && e.shiftKey) zoomTo(min + span * 0.2, max + span * 0.2);
    else if (e.key === "ArrowLeft") step(-1);
    else if (e.key === "ArrowRight") step(1);
    else return;
    e.preventDefault();
  }
  function step(d) {
    const idx = M.state.events.index;
    const p = lowerBound(idx, current) + d;
    if (p >= 0 && p < idx.length) select(idx[p]);
  }
  T.step = step;

  /* ---------- the OOMs, summarised: the fatal one first, then the handled ones by call-site and handler ---------- */
  const GROUPS_SHOWN = 4; // handled groups in the strip; the table below lists every OOM
  function oomButton(id, text) {
    const o = oom(id);
    const b = el("button", o.handled ? "oom handled" : "oom fatal", text);
    b.type = "button";
    b.dataset.oom = String(id);
    b.title = "seq " + o.seq + ": " + fmtBytes(o.rounded) + " at " + siteText(o.stack) + (o.index < 0 ? " (device " + o.device + ", not drawn)" : "");
    if (o.index < 0) b.disabled = true;
    b.addEventListener("click", () => T.selectOOM(id));
    return b;
  }
  function pick(G, label) {
    const sel = el("select", "oom-pick");
    sel.setAttribute("aria-label", label);
    sel.append(el("option", null, "each of " + G.count.toLocaleString() + "…"));
    for (const id of G.ids) {
      const o = oom(id), opt = el("option", null, "seq " + o.seq + " · " + fmtBytes(o.rounded));
      opt.value = String(id);
      if (o.index < 0) opt.disabled = true;
      sel.append(opt);
    }
    if (G.count > G.ids.length) { const more = el("option", null, "… " + (G.count - G.ids.length).toLocaleString() + " more: the table of every OOM"); more.disabled = true; sel.append(more); }
    sel.addEventListener("change", () => { if (sel.value !== "") T.selectOOM(Number(sel.value)); sel.selectedIndex = 0; });
    return sel;
  }
  function sizes(G) { return G.rounded_min === G.rounded_max ? fmtBytes(G.rounded_min) : fmtBytes(G.rounded_min) + "–" + fmtBytes(G.rounded_max); }
  function oomStrip() {
    const box = $("oom-strip"), n = M.ooms.count;
    if (!n) { box.append(el("span", "help", "No OOM in this trace.")); return; }
    let handled = 0;
    for (let i = 0; i < n; i++) handled += M.ooms.handled[i];
    box.append(el("span", "oom-count", plural(n, "OOM") + (handled && handled < n ? " (" + (n - handled).toLocaleString() + " fatal, " +
      handled.toLocaleString() + " handled):" : handled ? " (all handled):" : ":")));
    const groups = M.oom_groups;
    let shown = 0, rest = 0, restGroups = 0;
    groups.forEach((G, g) => {
      if (G.handled && shown >= GROUPS_SHOWN) { rest += G.count; restGroups++; return; }
      if (G.handled) shown++;
      const grp = el("span", "oom-group " + (G.handled ? "handled" : "fatal"));
      grp.dataset.group = String(g);
      const site = (G.site || "(no call-site)");
      if (!G.handled) {
        for (const id of G.ids.slice(0, 2)) { const o = oom(id); grp.append(oomButton(id, "FATAL OOM seq " + o.seq + " · " + fmtBytes(o.rounded) + " · " + o.diagnosis)); }
        if (G.count > 2) grp.append(pick(G, "fatal OOMs at " + site));
      } else {
        grp.append(oomButton(G.ids[0], "handled ×" + G.count.toLocaleString()));
        if (G.count > 1) grp.append(pick(G, "handled OOMs at " + site));
      }
      const where = el("span", "gsite", "at " + site + " · " + sizes(G));
      where.title = site + (G.handler ? "\nhandled by: " + G.handler : "");
      grp.append(where);
      box.append(grp);
    });
    if (rest) box.append(el("span", "help", "… and " + plural(rest, "handled OOM") + " at " + plural(restGroups, "other call-site") + ": the table of every OOM below."));
    const by = new Map();  // the handlers, named once each
    for (const G of groups) if (G.handled) { const k = G.handler || "not named (the program went on)"; const v = by.get(k) || [0, 0]; v[0] += G.count; v[1]++; by.set(k, v); }
    if (by.size) {
      const p = el("p", "help handlers");
      p.textContent = "Handled: " + [...by].map(([h, [c, s]]) => h + ", " + plural(c, "OOM") + " at " + plural(s, "call-site")).join("; ") + ".";
      box.after(p);
    }
  }
  function oomTable() {
    const O = M.ooms, rows = new Array(O.count);
    for (let i = 0; i < O.count; i++) {
      rows[i] = [O.seq[i], O.device[i], O.rounded[i], O.handled[i] ? "handled" : "fatal", O.diagnoses[O.diagnosis[i]], siteText(O.stack[i])];
    }
    return table({ title: "Every OOM", columns: ["seq", "device", "request", "outcome", "diagnosis", "call-site"],
      kinds: ["int", "int", "bytes", "text", "text", "text"], rows, note: "Click a row to show the memory map at that OOM.", link: "oom" });
  }

  /* ---------- budget ---------- */
  const BUDGET_COL = { "other processes": "#8c564b", context: "#7f7f7f", "local memory": "#9467bd", heaps: "#bcbd22",
    "pool reserved": "#ff7f0e", free: "#2ca02c", unaccounted: "#dddddd" };
  function showBudget(oom) {
    const box = $("budget");
    box.replaceChildren();
    const b = oom && oom.budget ? oom.budget : oom ? null : M.budget_start;
    if (!b) { box.append(el("p", "help", "The device budget was not recorded for " + (oom ? "this OOM." : "this trace."))); return; }
    const total = Math.max(...[b.start, b.oom].map((x) => x.total || x.parts.reduce((s, p) => s + Math.max(p.bytes || 0, 0), 0)), 1);
    for (const bar of [b.start, b.oom]) {
      const row = el("div", "brow");
      row.append(el("div", "blabel", bar.label));
      const strip = el("div", "bbar");
      for (const p of bar.parts) {
        if (!p.bytes || p.bytes <= 0) continue;
        const seg = el("div", "bpart" + (p.name === b.changed ? " changed" : ""));
        seg.style.width = (100 * p.bytes / total).toFixed(3) + "%";
        seg.style.background = BUDGET_COL[p.name] || "#ccc";
        seg.title = p.name + ": " + fmtBytes(p.bytes) + " (" + p.how + ")";
        if (p.bytes / total > 0.08) seg.textContent = p.name;
        strip.append(seg);
      }
      if (bar === b.oom && b.pool_limit && total > 1) cap(strip, bar, b.pool_limit, total);
      row.append(strip);
      box.append(row);
    }
    if (b.capped) box.append(el("p", "capped", b.capped + "."));
    const legend = el("div", "legend");
    for (const p of b.oom.parts) {
      const s0 = b.start.parts.find((q) => q.name === p.name);
      const sw = el("span", "sw"); sw.style.background = BUDGET_COL[p.name] || "#ccc";
      const item = el("span", "litem");
      item.append(sw, el("span", null, p.name + ": " + fmtBytes(s0 ? s0.bytes : null) + " → " + fmtBytes(p.bytes) + " (" + p.how + ")"));
      legend.append(item);
    }
    box.append(legend);
    if (b.changed) box.append(el("p", "changed-term", "Changed most: " + b.changed + " (" + (b.change_bytes >= 0 ? "+" : "") + fmtBytes(b.change_bytes) + ")"));
    if (b.takers) box.append(el("p", "help", b.takers));
  }

  /* The pool's cap on the OOM bar: a dashed mark where the pool would have to stop (its parts before the pool,
     then the cap), labelled with its figure. */
  function cap(strip, bar, limit, total) {
    let before = 0;
    for (const p of bar.parts) { if (p.name === "pool reserved") break; before += Math.max(p.bytes || 0, 0); }
    const at = 100 * (before + limit) / total;
    if (!(at > 0 && at < 100)) return;
    const m = el("div", "bcap");
    m.style.left = at.toFixed(3) + "%";
    m.title = "the pool's cap: " + fmtBytes(limit);
    m.append(el("span", null, "cap " + fmtBytes(limit)));
    strip.append(m);
  }

  /* ---------- tables ---------- */
  function cell(v, kind) {
    if (v === null || v === undefined) return "";
    if (kind === "bytes") return fmtBytes(v);
    if (kind === "percent") return (100 * v).toFixed(1) + "%";
    if (kind === "bool") return v ? "yes" : "no";
    if (kind === "int") return Number(v).toLocaleString();
    return String(v);
  }
  function table(tv) {
    const sec = el("section", "tbl");
    sec.append(el("h2", null, tv.title));
    if (tv.note) sec.append(el("p", "help", tv.note));
    if (!tv.columns.length) return sec;
    const t = el("table", "t"), head = el("tr"), body = el("tbody");
    const order = tv.rows.map((_, i) => i);
    let sortCol = -1, asc = true;
    const MAXROWS = 500; // rows drawn; sorting reorders all of them
    function fill() {
      body.replaceChildren();
      for (const i of order.slice(0, MAXROWS)) {
        const tr = el("tr");
        tv.rows[i].forEach((v, c) => {
          const td = el("td", tv.kinds[c] === "text" ? null : "num", cell(v, tv.kinds[c]));
          if (tv.kinds[c] === "bytes" && v !== null) td.title = Number(v).toLocaleString() + " B";
          tr.append(td);
        });
        if (tv.link === "oom") {
          tr.className = "link"; tr.dataset.oom = String(i);
          tr.addEventListener("click", () => T.selectOOM(i));
        }
        body.append(tr);
      }
    }
    tv.columns.forEach((c, ci) => {
      const th = el("th", null, c);
      th.title = "click to sort";
      th.addEventListener("click", () => {
        asc = sortCol === ci ? !asc : tv.kinds[ci] === "text";
        sortCol = ci;
        order.sort((a, b) => {
          const x = tv.rows[a][ci], y = tv.rows[b][ci];
          const r = x === y ? 0 : x === null ? 1 : y === null ? -1 : x < y ? -1 : 1;
          return asc ? r : -r;
        });
        fill();
      });
      head.append(th);
    });
    t.append(el("thead"), body);
    t.firstChild.append(head);
    fill();
    sec.append(t);
    if (tv.rows.length > MAXROWS) sec.append(el("p", "help", "First " + MAXROWS + " of " + tv.rows.length + " rows (sort to see others)."));
    return sec;
  }
  function facts() {
    const t = $("facts");
    for (const [k, v] of M.facts) { const tr = el("tr"); tr.append(el("th", null, k), el("td", null, v)); t.append(tr); }
  }
  function legend() {
    const box = $("legend");
    M.label_rank.slice(0, M.palette.length).forEach((l, i) => {
      const item = el("span", "litem"), sw = el("span", "sw");
      sw.style.background = M.palette[i];
      item.append(sw, el("span", null, M.stacks.labels[l]));
      box.append(item);
    });
    const item = el("span", "litem"), sw = el("span", "sw"); sw.style.background = "#9e9e9e";
    item.append(sw, el("span", null, "every other call-site"));
    const f = el("span", "litem"), fs = el("span", "sw"); fs.style.background = "rgb(214,240,214)";
    f.append(fs, el("span", null, "free inside a segment (outlined: the largest free block)"));
    box.append(item, f);
  }
  function baseline() {
    const B = M.baseline;
    if (!B) return;
    const sec = $("s-baseline");
    sec.append(el("h2", null, "Against the baseline: " + B.name));
    const lv = TL.levels[0];
    const mine = { x: Array.from({ length: lv.count }, (_, i) => i * lv.bucket), live: Array.from(lv.hi.live || [], (v) => v / 1048576),
      reserved: Array.from(lv.hi.reserved || lv.hi.live || [], (v) => v / 1048576) };
    const theirs = { x: Array.from({ length: B.live.length }, (_, i) => i * B.bucket), live: Array.from(B.live, (v) => v / 1048576),
      reserved: Array.from(B.reserved, (v) => v / 1048576) };
    const data = uPlot.join([[mine.x, mine.live, mine.reserved], [theirs.x, theirs.live, theirs.reserved]]);
    const div = el("div"); sec.append(div);
    new uPlot({ width: Math.min(1400, Math.max(600, sec.clientWidth || 1200)), height: 260,
      scales: { x: { time: false } }, axes: [{ label: "event index (each trace from its start)" }, { label: "MiB", size: 70 }],
      series: [{}, { label: "live", stroke: COL.live, spanGaps: true }, { label: "reserved", stroke: COL.reserved, spanGaps: true },
        { label: "baseline live", stroke: COL.live, dash: [6, 4], spanGaps: true }, { label: "baseline reserved", stroke: COL.reserved, dash: [6, 4], spanGaps: true }] },
    data, div);
    sec.append(table({ title: "Both summaries", columns: ["metric", M.trace.name, B.name], kinds: ["text", "text", "text"], rows: B.summary, note: null, link: null }));
  }

  /* ---------- the answer: what to change, above everything else ---------- */
  /* Text shown in `pre` with a button that copies it (or, where a file:// page cannot reach the
     clipboard API, selects it for Ctrl+C), saying which in `out`. */
  function pasteable(pre, button, out, text) {
    $(pre).textContent = text;
    $(button).addEventListener("click", async () => {
      let ok = false;
      try { await navigator.clipboard.writeText(text); ok = true; } catch (e) { ok = false; }
      if (!ok) {
        const r = document.createRange(); r.selectNodeContents($(pre));
        const s = window.getSelection(); s.removeAllRanges(); s.addRange(r);
      }
      $(out).textContent = ok ? "copied" : "selected: press Ctrl+C";
    });
  }

  function answer() {
    const A = M.answer;
    if (!A) return;
    $("answer").hidden = false;
    $("answer-text").textContent = A.recommendation;
    const box = $("answer-line").parentElement;
    if (A.line) pasteable("answer-line", "copy-line", "copied", A.line);
    else box.hidden = true;
    if (A.whole_run.length) {  // a run that died: how to get the trace that answers for the whole run
      $("whole").hidden = false;
      pasteable("whole-lines", "copy-whole", "copied-whole", A.whole_run.join("\n"));
    }
    const parts = [];
    if (A.setting) parts.push(A.setting + ": " + (A.verdict === "fits" ? "fits" : A.verdict));
    if (A.headroom_bytes !== null && A.headroom_bytes !== undefined) parts.push("headroom " + fmtBytes(A.headroom_bytes));
    if (A.margin_bytes !== null && A.margin_bytes !== undefined)  // 0 B: the model is exact
      parts.push(A.margin_bytes > 0 ? "margin " + fmtBytes(A.margin_bytes) : "margin: any headroom above 0");
    parts.push(A.scope);
    $("answer-margin").textContent = parts.join("; ") + (A.margin_why ? ". Margin: " + A.margin_why + "." : ".");
    const checks = $("answer-checks");  // the replay (or model), the device, a real run: each done or not
    if (A.checks.length) {
      checks.append(el("b", null, "Checked: "));
      A.checks.forEach((c, i) => {
        if (i) checks.append("; ");
        const s = el("span", c.done ? "check done" : "check not-done", (c.done ? "\u2713 " : "\u2013 ") + c.said);
        s.dataset.how = c.how;
        checks.append(s);
      });
      checks.append(".");
    } else checks.hidden = true;
    if (A.cures.length) {  // the device ran out: the cures its budget shows, the recommended ones first
      const box = $("answer-cures");
      box.hidden = false;
      box.append(el("b", null, A.cures.length === 1 ? "The cure:" : "The cures, the recommended first:"));
      const ul = el("ul", "cures");
      for (const c of A.cures) {
        const li = el("li", c.chosen ? "cure chosen" : "cure");
        li.append(el("span", null, c.target + " \u2014 gives back " + fmtBytes(c.returns_bytes) + " (" + c.how + ")" +
          (c.chosen ? ", recommended" : "") + "; " + c.when + ": "));
        li.append(el("code", null, c.action));
        ul.append(li);
      }
      box.append(ul);
    }
  }

  /* ---------- start ---------- */
  async function main() {
    const t0 = performance.now();
    $("title").textContent = M.title;
    $("verdict").textContent = M.verdict.text;
    $("explanation").textContent = M.verdict.explanation || "";
    answer();
    const phases = {}, mark = (name) => { phases[name] = Math.round(performance.now()); };
    mark("parsed");
    await decodeAll();
    mark("decoded");
    colours();
    initOOMs();
    initState();
    facts();
    legend();
    oomStrip();
    FL = window.tracekitFlame(M, { el, fmtBytes, showTip, hideTip, siteText });
    FL.mount($("s-flame"), { select, selectOOM: T.selectOOM, oomIds: () => onDevId, stepOOM });
    T.flame = FL;
    mark("state");
    buildTimeline();
    mark("timeline");
    $("state-note").textContent = M.state.note + (M.trace.devices.length > 1 ? " This page draws device " + M.trace.device +
      " (the reported OOM's); the other devices' OOMs are listed." : "");
    const scrub = $("scrub");
    scrub.max = String(Math.max(TL.n - 1, 0));
    scrub.addEventListener("input", () => select(Number(scrub.value)));
    scrub.addEventListener("keydown", (e) => { if (e.key === "ArrowLeft" || e.key === "ArrowRight") { e.preventDefault(); e.stopPropagation(); step(e.key === "ArrowLeft" ? -1 : 1); } });
    $("go-seq").addEventListener("click", () => T.selectSeq(Number($("scrub-seq").value)));
    $("prev").addEventListener("click", () => step(-1));
    $("next").addEventListener("click", () => step(1));
    const map = $("map");
    map.addEventListener("mousemove", (e) => {
      const h = mapHit(e);
      if (!h) { hideTip(); return; }
      showTip(h.block !== undefined ? blockTip(h.block) : segTip(h.seg), e.clientX, e.clientY);
    });
    map.addEventListener("mouseleave", hideTip);
    document.addEventListener("keydown", keys);
    const tabs = $("s-tables");
    if (M.ooms.count) tabs.append(oomTable());
    for (const tv of M.tables) tabs.append(table(tv));
    baseline();
    mark("tables");
    let fatal = -1;
    for (let i = 0; i < onDevId.length && fatal < 0; i++) if (M.ooms.handled[onDevId[i]] === 0) fatal = onDevId[i];
    if (fatal < 0 && onDevId.length) fatal = onDevId[0];
    if (fatal >= 0) select(M.ooms.index[fatal]);
    else if (M.peak.reserved_index !== null) select(M.peak.reserved_index);
    if (fatal < 0) showBudget(null);
    mark("selected");
    T.phases = phases;
    T.loadMs = performance.now() - t0;
    T.readyAt = performance.now(); // since navigation start
    $("status").textContent = "";
    T.ready = true;
    document.body.dataset.ready = "1";
  }
  main().catch((e) => { $("status").textContent = "The page could not be drawn: " + e; console.error(e); });
})();
