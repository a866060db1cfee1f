/* tracekit report page: the flame graph (icicle) of the bytes live at the selected event.
   Root at the top, outermost frame first, each node as wide as the bytes its stack and the stacks
   it calls hold. Built from the page's one data model: the live blocks the page reconstructs at any
   event (page.js) and the FRAME and STACK tables (docs/report-page.md). Every string from the trace
   goes in through textContent (the graph itself is drawn on a canvas, its labels as canvas text). page.js calls window.tracekitFlame(model, lib) once, then draw(). */
(function () {
  "use strict";
  const ROOT = -3, NOSTACK = -4, NATIVE_RUN = -2; // node "frames" that are not frames
  const ROW = 18; // px per level
  const MINPX = 0.5; // nodes narrower than this are not drawn (their bytes still count above)
  const MAXNODES = 6000; // drawn at most; past that the narrowest are left out
  const HUE = { user: [28, 85], library: [208, 55], stdlib: [0, 0], native: [268, 45] };

  window.tracekitFlame = function (M, lib) {
    const { el, fmtBytes, showTip, hideTip, siteText } = lib;
    const F = M.frames, S = M.stacks, B = M.state.blocks;
    const NATIVE = F.kinds.indexOf("native");
    const ns = S.frame.length, K = F.file.length + 8;
    const hasNative = F.kind.some((k) => k === NATIVE);
    const box = el("canvas", null);
    box.id = "flame";
    box.setAttribute("role", "img");
    box.setAttribute("aria-label", "flame graph of the live bytes by call stack; hover a frame for its details, " +
      "or focus it and move between frames with the arrow keys (Enter zooms)");
    box.tabIndex = 0; // reachable by Tab: the arrow keys walk the drawn frames (``cursor``)
    let collapse = hasNative; // C++ frames folded into one node per run by default
    let tree = build(collapse), focus = 0, last = null, cursor = -1;

    /* The tree of paths: node 0 the root (every live block), node 1 the blocks without a stack, then one
       node per distinct (parent node, frame), so stacks that repeat a path share its node. With
       ``fold``, each run of consecutive native frames is one node. Node ids grow away from the root
       (a parent stack has a smaller id than its children), so one pass from the last node rolls bytes up. */
    function build(fold) {
      const nodeOf = new Int32Array(ns), parent = [-1, 0], frame = [ROOT, NOSTACK], index = new Map();
      for (let s = 0; s < ns; s++) {
        const p = S.parent[s] >= 0 ? nodeOf[S.parent[s]] : 0, f = S.frame[s];
        let key = f;
        if (fold && F.kind[f] === NATIVE) {
          if (frame[p] === NATIVE_RUN) { nodeOf[s] = p; continue; }
          key = NATIVE_RUN;
        }
        const k = p * K + (key + 8);
        let n = index.get(k);
        if (n === undefined) { n = frame.length; index.set(k, n); frame.push(key); parent.push(p); }
        nodeOf[s] = n;
      }
      const n = frame.length, start = new Int32Array(n + 1), depth = new Int32Array(n);
      for (let i = 1; i < n; i++) { start[parent[i] + 1]++; depth[i] = depth[parent[i]] + 1; }
      for (let i = 0; i < n; i++) start[i + 1] += start[i];
      const kids = new Int32Array(Math.max(n - 1, 0)), fill = start.slice(0, n);
      for (let i = 1; i < n; i++) kids[fill[parent[i]]++] = i;
      return { n, nodeOf, parent: Int32Array.from(parent), frame: Int32Array.from(frame), start, kids, depth,
        labels: new Array(n), width: new Float32Array(n).fill(-1) }; // label and its drawn width, once each
    }

    /* Bytes (rounded, as the analyzer's live bytes) and blocks per node: each block to its stack's node,
       then every node's total into its parent's, from the last node down. */
    function weigh(blocks) {
      const n = tree.n, self = new Float64Array(n), count = new Float64Array(n);
      for (let i = 0; i < blocks.length; i++) {
        const b = blocks[i], s = B.stack[b], v = s >= 0 ? tree.nodeOf[s] : 1;
        self[v] += B.rounded[b]; count[v] += 1;
      }
      const total = self.slice(), blocksIn = count.slice();
      for (let i = n - 1; i > 0; i--) { total[tree.parent[i]] += total[i]; blocksIn[tree.parent[i]] += blocksIn[i]; }
      return { self, total, blocks: blocksIn };
    }

    function kindOf(v) {
      const f = tree.frame[v];
      if (f === ROOT) return "root";
      if (f === NOSTACK) return "none";
      if (f === NATIVE_RUN) return "run";
      return F.kinds[F.kind[f]] || "library";
    }
    function label(v) { // memoised per node: labels are asked for at every redraw
      let t = tree.labels[v];
      if (t === undefined) t = tree.labels[v] = labelOf(v);
      return t;
    }
    function labelOf(v) {
      const f = tree.frame[v];
      if (f === ROOT) return "all live blocks";
      if (f === NOSTACK) return "(no call stack)";
      if (f === NATIVE_RUN) return "C++ (native)";
      const base = F.file[f].split("/").pop(), at = F.line[f] >= 0 ? base + ":" + F.line[f] : base;
      return F.function[f] ? F.function[f] + " (" + at + ")" : at;
    }
    function where(f) { return F.file[f] + (F.line[f] >= 0 ? ":" + F.line[f] : ""); }
    const frameColour = new Array(F.file.length); // per frame, as #rrggbb (the quickest colour to parse)
    function colour(v) {
      const f = tree.frame[v];
      if (f < 0) return null;
      if (frameColour[f] !== undefined) return frameColour[f];
      const [h, s] = F.user[f] ? HUE.user : HUE[F.kinds[F.kind[f]]] || HUE.library;
      let x = 0; // lightness by a hash of the name, so neighbours differ
      const name = F.function[f] + F.file[f];
      for (let i = 0; i < name.length; i++) x = (x * 31 + name.charCodeAt(i)) >>> 0;
      return (frameColour[f] = hslHex(h, s / 100, (64 + (x % 12)) / 100));
    }
    function hslHex(h, s, l) {
      const a = s * Math.min(l, 1 - l);
      const c = (n) => { const k = (n + h / 30) % 12; return Math.round(255 * (l - a * Math.max(-1, Math.min(k - 3, 9 - k, 1)))); };
      return "#" + [c(0), c(8), c(4)].map((x) => x.toString(16).padStart(2, "0")).join("");
    }
    /* Path of a stack's node, root first (the failing request's, at an OOM). */
    function pathOf(stack) {
      const out = [];
      for (let v = stack >= 0 ? tree.nodeOf[stack] : -1; v >= 0; v = tree.parent[v]) out.unshift(v);
      return out;
    }

    /* Which nodes are drawn where: the focus's ancestors and the focus full width, its descendants
       scaled by the focus's bytes, children widest first, anything narrower than MINPX left out. */
    function layout(w, wt) {
      const out = [], chain = [];
      for (let v = focus; v >= 0; v = tree.parent[v]) chain.unshift(v);
      chain.forEach((v, d) => out.push({ v, x: 0, w, d, anc: v !== focus }));
      const scale = w / Math.max(wt.total[focus], 1);
      let minBytes = MINPX / scale;
      const todo = [[focus, 0, chain.length - 1]];
      for (let q = 0; q < todo.length && out.length < MAXNODES; q++) {
        const [v, x0, d] = todo[q]; // breadth first: the shallow levels are drawn before a cap bites
        const kids = Array.from(tree.kids.subarray(tree.start[v], tree.start[v + 1]))
          .filter((c) => wt.total[c] >= minBytes && wt.total[c] > 0)
          .sort((a, b) => wt.total[b] - wt.total[a] || a - b);
        let x = x0;
        for (const c of kids) {
          const cw = wt.total[c] * scale;
          out.push({ v: c, x, w: cw, d: d + 1, anc: false });
          todo.push([c, x, d + 1]);
          x += cw;
          if (out.length >= MAXNODES) { minBytes = Infinity; break; }
        }
      }
      return out;
    }

    /* One canvas, drawn in one pass: a page of thousands of nodes redraws in a few ms and adds no
       element to lay out. Hover and click find the node under the pointer from the layout (rows). */
    let cssWidth = 0, rows = [], shown = null;
    const FONT = "11px system-ui, sans-serif", BOLD = "600 11px system-ui, sans-serif";
    const FIXED = { root: "#4d4d4d", none: "#9e9e9e", run: "#b8a2dc" };
    function fit(g, v, room) { // node v's label cut to fit ``room`` px, with an ellipsis
      if (room <= 0) return "";
      const text = label(v);
      let w = tree.width[v];
      if (w < 0) w = tree.width[v] = g.measureText(text).width;
      if (w <= room) return text;
      let n = Math.floor(text.length * room / w);
      while (n > 0 && g.measureText(text.slice(0, n) + "…").width > room) n--;
      return n > 0 ? text.slice(0, n) + "…" : "";
    }
    function keyed() { return document.activeElement === box; }
    function draw(st, ctx) {
      last = { st, ctx };
      const wt = weigh(st.blocks);
      if (focus >= tree.n || wt.total[focus] <= 0) focus = 0;
      if (cursor >= tree.n || cursor < 0 || wt.total[cursor] <= 0) cursor = focus;
      const req = new Set(ctx.oom && ctx.oom.stack >= 0 ? pathOf(ctx.oom.stack).slice(1) : []); // the root aside
      if (!cssWidth) cssWidth = Math.max(box.clientWidth || 1200, 200);
      const w = cssWidth, nodes = layout(w, wt);
      let depth = 0;
      for (const p of nodes) depth = Math.max(depth, p.d);
      const h = (depth + 1) * ROW, dpr = window.devicePixelRatio || 1;
      const bw = Math.round(w * dpr), bh = Math.round(h * dpr);
      if (box.width !== bw || box.height !== bh) { // a new size reallocates the canvas: only when it changes
        box.width = bw; box.height = bh;
        box.style.height = (h + 2) + "px"; // border-box: the 1 px border each side
      }
      const g = box.getContext("2d");
      g.setTransform(dpr, 0, 0, dpr, 0, 0);
      g.clearRect(0, 0, w, h);
      g.textBaseline = "middle";
      let font = "";
      rows = Array.from({ length: depth + 1 }, () => []);
      nodes.forEach((p, i) => {
        const f = tree.frame[p.v], kind = kindOf(p.v), mine = f >= 0 && F.user[f], y = p.d * ROW;
        p.mine = mine; p.req = req.has(p.v);
        rows[p.d].push(i);
        if (p.anc) g.globalAlpha = 0.8;
        g.fillStyle = FIXED[kind] || colour(p.v);
        g.fillRect(p.x, y, Math.max(p.w - 1, 0.5), ROW - 1);
        if (mine && p.w >= 8) { g.fillStyle = "#b35900"; g.fillRect(p.x, y, 3, ROW - 1); } // narrower: the colour says it
        if (p.v === focus) { g.fillStyle = "#000"; g.fillRect(p.x, y + ROW - 3, p.w - 1, 2); }
        if (p.anc) g.globalAlpha = 1;
        if (p.req) { g.strokeStyle = "#d00"; g.lineWidth = 2; g.strokeRect(p.x + 1, y + 1, Math.max(p.w - 3, 0.5), ROW - 3); }
        if (p.v === cursor && keyed()) { g.setLineDash([3, 2]); g.strokeStyle = "#0645ad"; g.lineWidth = 2; g.strokeRect(p.x + 1, y + 1, Math.max(p.w - 3, 0.5), ROW - 3); g.setLineDash([]); }
        p.text = "";
        if (p.w >= 28) {
          if (font !== (mine ? BOLD : FONT)) g.font = font = mine ? BOLD : FONT; // a font change is parsed
          g.fillStyle = kind === "root" ? "#fff" : "#111";
          p.text = fit(g, p.v, p.w - (mine ? 9 : 6));
          if (p.text) g.fillText(p.text, p.x + (mine ? 6 : 3), y + ROW / 2);
        }
      });
      if (!nodes.some((p) => p.v === cursor)) cursor = focus; // left out of the drawing: back to the focus
      shown = { focus, total: wt.total[0], width: w, nodes, wt };
      api.weights = wt;
      api.drawn = nodes;
      if (keyed()) said.textContent = tip(cursor).join(" · ");
      head(st, ctx, wt);
      request(ctx, req, wt);
    }
    window.addEventListener("resize", () => {
      const w = Math.max(box.clientWidth || 1200, 200);
      if (w !== cssWidth) { cssWidth = w; if (last) draw(last.st, last.ctx); }
    });

    const title = el("p", "fl-title"), note = el("div", "fl-note");
    const said = el("p", "fl-said"); // the frame under the keyboard cursor, in words (read out: aria-live)
    said.setAttribute("aria-live", "polite");
    function head(st, ctx, wt) {
      title.textContent = "Live " + ctx.when + ": " + fmtBytes(wt.total[0]) + " in " + wt.blocks[0].toLocaleString() +
        " blocks" + (focus !== 0 ? "; zoomed into " + label(focus) + " (" + fmtBytes(wt.total[focus]) + ")" : "") + ".";
    }
    function request(ctx, req, wt) {
      note.replaceChildren();
      const o = ctx.oom;
      if (!o) return;
      const p = el("p", "req");
      p.append(el("b", null, (o.handled ? "Handled" : "Fatal") + " OOM: "));
      if (o.stack < 0) { p.append(el("span", null, "the failing request (" + fmtBytes(o.rounded) + ") has no call stack in the trace.")); note.append(p); return; }
      const names = [];
      for (let s = o.stack, i = 0; s >= 0 && i < 256; i++, s = S.parent[s]) names.unshift(S.frame[s]);
      p.append(el("span", null, "the failing request (" + fmtBytes(o.rounded) + ") at " + siteText(o.stack) +
        " came from, outermost first: "));
      names.forEach((f, i) => {
        if (i) p.append(el("span", null, " → "));
        p.append(el("span", F.user[f] ? "mine-text" : null, (F.function[f] || "?") + " (" + where(f) + ")"));
      });
      const held = [...req].map((v) => wt.total[v]);
      p.append(el("span", null, ". Outlined red: its frames" + (held.length ? "; the innermost holds " + fmtBytes(held[held.length - 1]) + " live" : "") + "."));
      note.append(p);
    }

    function tip(v) {
      const wt = api.weights, f = tree.frame[v], all = wt.total[0], lines = [];
      if (f >= 0) {
        lines.push(F.function[f] ? F.function[f] : "(no function name)");
        lines.push(where(f));
        lines.push(F.kinds[F.kind[f]] + " frame" + (F.user[f] ? " · your code" : ""));
      } else lines.push(label(v) + (f === NATIVE_RUN ? ": C++ frames folded into one (tick “show C++ frames”)" : ""));
      lines.push(fmtBytes(wt.total[v]) + " (" + wt.total[v].toLocaleString() + " B) in " + wt.blocks[v].toLocaleString() + " blocks" +
        (wt.self[v] > 0 && wt.self[v] < wt.total[v] ? "; " + fmtBytes(wt.self[v]) + " allocated here" : ""));
      lines.push((100 * wt.total[v] / Math.max(all, 1)).toFixed(1) + "% of the live bytes at this event" +
        (focus !== 0 && v !== focus ? ", " + (100 * wt.total[v] / Math.max(wt.total[focus], 1)).toFixed(1) + "% of " + label(focus) : ""));
      const o = last && last.ctx.oom;
      if (o && o.stack >= 0 && v !== 0 && pathOf(o.stack).includes(v)) lines.push("on the failing request's stack");
      const above = new Set(); // the focus's ancestors
      for (let u = tree.parent[focus]; u >= 0; u = tree.parent[u]) above.add(u);
      const act = keyed() ? "Enter" : "click"; // what the user is zooming with
      lines.push(v === focus ? (v ? act + ": zoom out" : "") : above.has(v) ? act + ": zoom out to here" : act + ": zoom in");
      return lines.filter((l) => l);
    }
    function zoom(v) {
      focus = v === focus ? Math.max(tree.parent[v], 0) : v;
      if (last) draw(last.st, last.ctx);
    }
    function nodeAt(e) { // the node under the pointer (-1 none): its row, then the last node starting left of it
      const r = box.getBoundingClientRect(), x = (e.clientX - r.left) * cssWidth / r.width, d = Math.floor((e.clientY - r.top) / ROW);
      const row = rows[d], N = api.drawn;
      if (!row || !N) return -1;
      let lo = 0, hi = row.length;
      while (lo < hi) { const m = (lo + hi) >>> 1; if (N[row[m]].x <= x) lo = m + 1; else hi = m; }
      const p = lo > 0 ? N[row[lo - 1]] : null;
      return p && x < p.x + p.w ? p.v : -1;
    }
    box.addEventListener("click", (e) => { const v = nodeAt(e); if (v >= 0) zoom(v); });
    box.addEventListener("mousemove", (e) => {
      const v = nodeAt(e);
      box.style.cursor = v < 0 ? "default" : "pointer";
      if (v < 0) hideTip(); else showTip(tip(v), e.clientX, e.clientY);
    });
    box.addEventListener("mouseleave", hideTip);

    /* The keyboard: arrows move the cursor over the drawn frames (up: the caller, down: the widest
       callee, left and right: the neighbours in the row), Enter or space zooms as a click does. */
    function step(key) {
      const N = api.drawn || [], at = N.findIndex((p) => p.v === cursor);
      if (at < 0) return cursor;
      const p = N[at];
      if (key === "ArrowUp") return p.d > 0 ? tree.parent[p.v] : p.v;
      if (key === "ArrowDown") { const c = N.find((q) => q.d === p.d + 1 && tree.parent[q.v] === p.v); return c ? c.v : p.v; }
      const row = rows[p.d], i = row.indexOf(at), j = key === "ArrowLeft" ? i - 1 : i + 1;
      return j >= 0 && j < row.length ? N[row[j]].v : p.v;
    }
    box.addEventListener("keydown", (e) => {
      if (e.ctrlKey || e.metaKey || e.altKey) return;
      if (e.key === "ArrowUp" || e.key === "ArrowDown" || e.key === "ArrowLeft" || e.key === "ArrowRight") cursor = step(e.key);
      else if (e.key === "Enter" || e.key === " ") { zoom(cursor); e.preventDefault(); return; }
      else return;
      e.preventDefault();
      if (last) draw(last.st, last.ctx);
    });
    box.addEventListener("focus", () => { if (last) draw(last.st, last.ctx); });
    box.addEventListener("blur", () => { said.textContent = ""; if (last) draw(last.st, last.ctx); });

    /* The controls: the peak, each OOM (fatal ones as buttons, every one in the list), never freed. */
    function controls(go) {
      const bar = el("div", "controls fl-controls");
      const button = (text, cls, fn, hint) => {
        const b = el("button", cls, text); b.type = "button"; b.title = hint; b.addEventListener("click", fn); bar.append(b); return b;
      };
      if (M.peak.live_index !== null) button("peak live (" + fmtBytes(M.peak.live_bytes) + ")", "fl-peak", () => go.select(M.peak.live_index), "key p");
      const ids = go.oomIds(), fatal = ids.filter((i) => M.ooms.handled[i] === 0);
      for (const i of fatal) button("FATAL OOM seq " + M.ooms.seq[i], "oom fatal fl-fatal", () => go.selectOOM(i), "key f");
      if (ids.length) {
        const sel = el("select", "fl-ooms"); sel.setAttribute("aria-label", "OOM");
        sel.append(el("option", null, ids.length.toLocaleString() + (ids.length === 1 ? " OOM…" : " OOMs…")));
        for (const i of ids.slice(0, 2000)) {
          const o = el("option", null, (M.ooms.handled[i] ? "handled" : "FATAL") + " seq " + M.ooms.seq[i] + " · " + fmtBytes(M.ooms.rounded[i]));
          o.value = String(i); sel.append(o);
        }
        sel.addEventListener("change", () => { if (sel.value !== "") go.selectOOM(Number(sel.value)); sel.selectedIndex = 0; });
        bar.append(sel);
        button("◀ OOM", "fl-prev", () => go.stepOOM(-1), "key [");
        button("OOM ▶", "fl-next", () => go.stepOOM(1), "key ]");
      }
      button("never freed (live at the end)", "fl-end", () => go.select(M.timeline.n - 1), "key e");
      button("whole graph", "fl-reset", () => { focus = 0; if (last) draw(last.st, last.ctx); }, "key Escape");
      if (hasNative) {
        const l = el("label", "fl-native"), c = el("input");
        c.type = "checkbox"; c.checked = !collapse;
        c.addEventListener("change", () => { collapse = !c.checked; tree = build(collapse); focus = 0; if (last) draw(last.st, last.ctx); });
        l.append(c, el("span", null, " show C++ (native) frames"));
        bar.append(l);
      }
      document.addEventListener("keydown", (e) => {
        if (e.target && e.target.tagName === "INPUT" && e.target.type !== "range" && e.target.type !== "checkbox") return;
        if (e.ctrlKey || e.metaKey || e.altKey) return;
        if (e.key === "p" && M.peak.live_index !== null) go.select(M.peak.live_index);
        else if (e.key === "f" && fatal.length) go.selectOOM(fatal[0]);
        else if (e.key === "e") go.select(M.timeline.n - 1);
        else if (e.key === "[" && ids.length) go.stepOOM(-1);
        else if (e.key === "]" && ids.length) go.stepOOM(1);
        else if (e.key === "Escape" && focus !== 0) { focus = 0; if (last) draw(last.st, last.ctx); }
        else return;
        e.preventDefault();
      });
      return bar;
    }
    function legend() {
      const lg = el("div", "legend");
      const item = (text, cls, bg) => {
        const i = el("span", "litem"), sw = el("span", "sw " + cls);
        if (bg) sw.style.background = bg;
        i.append(sw, el("span", null, text)); lg.append(i);
      };
      item("your code" + (M.user_code.length ? " (under " + M.user_code.join(", ") + ")" : ""), "", "hsl(28,85%,72%)");
      item("installed library", "", "hsl(208,55%,72%)");
      item("Python's library", "", "hsl(0,0%,74%)");
      if (hasNative) item("C++ (native)", "", "hsl(268,45%,74%)");
      item("the failing request's stack, at an OOM", "sw-req", null);
      return lg;
    }
    const api = {
      mount(section, go) { section.append(controls(go), title, box, said, note, legend()); },
      draw,
      zoom,
      tree: () => tree,
      cursor: () => cursor,
      /* css pixel (x, y) and width of a drawn node, scrolled into view, for the tests */
      locate(v) {
        const p = (api.drawn || []).find((q) => q.v === v);
        if (!p) return null;
        let r = box.getBoundingClientRect();
        window.scrollBy(0, r.top + p.d * ROW + ROW / 2 - window.innerHeight / 2);
        r = box.getBoundingClientRect();
        const k = r.width / cssWidth;
        return { x: r.left + (p.x + p.w / 2) * k, y: r.top + p.d * ROW + ROW / 2, width: p.w * k };
      },
      nodeOfStack: (s) => (s >= 0 ? tree.nodeOf[s] : 1),
      /* what is drawn, for the tests and the benchmark: made when asked, not at every redraw */
      get view() {
        if (!shown) return null;
        const { wt } = shown;
        return { focus: shown.focus, total: shown.total, width: shown.width, nodes: shown.nodes.map((p) => ({ node: p.v,
          parent: tree.parent[p.v], frame: tree.frame[p.v], label: label(p.v), text: p.text, bytes: wt.total[p.v],
          self: wt.self[p.v], x: p.x, w: p.w, depth: p.d, req: p.req, mine: p.mine, kind: kindOf(p.v) })) };
      },
      weights: null,
    };
    return api;
  };
})();
