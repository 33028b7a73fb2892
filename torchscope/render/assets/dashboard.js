// torchscope dashboard: plain JS, no dependencies. Reads the embedded Report (and timeline lanes) and
// draws six views. Every string from the data goes in through textContent (el()), never innerHTML.
"use strict";
(function () {
  const DATA = JSON.parse(document.getElementById("ts-data").textContent);
  const R = DATA.report;
  const SIDE = DATA.sidecars || {};
  const COLORS = {
    kernel: "#3182ce", memcpy: "#805ad5", memset: "#b794f4", communication: "#dd6b20", runtime: "#d69e2e",
    data_loading: "#e53e3e", cpu_exec: "#38a169", forward: "#3182ce", backward: "#38a169", optimizer: "#d69e2e",
    other: "#a0aec0",
  };
  const PALETTE = ["#3182ce", "#38a169", "#dd6b20", "#805ad5", "#d53f8c", "#319795", "#d69e2e", "#e53e3e"];
  // Which view shows the evidence of a finding's category.
  const VIEW_OF = {
    data_loading: "timeline", compute: "kernels", host_overhead: "timeline", optimizer: "operators",
    outside_steps: "timeline", synchronization: "timeline", h2d_copy: "timeline", idle: "timeline",
    communication: "distributed", straggler: "distributed", memory: "memory", trace_quality: "overview",
  };

  function el(tag, attrs, ...children) {
    const node = tag.startsWith("svg:") ? document.createElementNS("http://www.w3.org/2000/svg", tag.slice(4))
      : document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "text") node.textContent = v;
      else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
      else node.setAttribute(k, v);
    }
    for (const c of children) if (c != null) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
    return node;
  }
  const color = (k, i) => COLORS[k] || PALETTE[i % PALETTE.length];
  function fmtUs(us) {
    if (us == null || isNaN(us)) return "-";
    const a = Math.abs(us);
    if (a >= 1e6) return (us / 1e6).toFixed(2) + " s";
    if (a >= 1e3) return (us / 1e3).toFixed(2) + " ms";
    return us.toFixed(a < 10 ? 2 : 1) + " us";
  }
  function fmtBytes(b) {
    if (b == null) return "-";
    const u = ["B", "KiB", "MiB", "GiB", "TiB"]; let i = 0;
    while (Math.abs(b) >= 1024 && i < u.length - 1) { b /= 1024; i++; }
    return b.toFixed(i ? 1 : 0) + " " + u[i];
  }
  function fmtRate(v) {  // FLOP/s with an SI prefix: 1.23 TFLOP/s
    if (v == null || isNaN(v)) return "-";
    const u = ["", "K", "M", "G", "T", "P"]; let i = 0;
    while (Math.abs(v) >= 1000 && i < u.length - 1) { v /= 1000; i++; }
    return v.toFixed(2) + " " + u[i] + "FLOP/s";
  }
  const pct = (f) => (f == null ? "-" : (100 * f).toFixed(1) + " %");
  const metric = (name) => { const m = (R.metrics || []).find((x) => x.name === name); return m ? m.value : null; };
  const card = (title, ...body) => el("div", { class: "card" }, el("h2", { text: title }), ...body);
  const fact = (k, v) => el("div", { class: "fact" }, el("div", { class: "k", text: k }), el("div", { class: "v", text: v == null ? "-" : String(v) }));

  // ---- navigation -------------------------------------------------------------------------------
  const drawn = {};
  const VIEWS = { overview: overview, operators: operators, kernels: kernels, timeline: timeline, modules: modules, memory: memory, distributed: distributed };
  // A view may take a moment to go to: "#memory@<rank>@<trace us>" (the rank's own trace clock), handled
  // by the function the view registers in FOCUS once drawn (timeline <-> memory links).
  const FOCUS = {};
  function show(route) {
    let [name, rank, t] = String(route).split("@");
    if (!VIEWS[name]) name = "overview";
    for (const s of document.querySelectorAll(".view")) s.classList.toggle("active", s.id === "view-" + name);
    for (const b of document.querySelectorAll("#ts-nav button")) b.classList.toggle("active", b.dataset.view === name);
    if (!drawn[name]) { drawn[name] = true; VIEWS[name](document.getElementById("view-" + name)); }
    const at = t == null || isNaN(Number(t)) ? null : { rank: Number(rank) || 0, t_us: Number(t) };
    if (at && FOCUS[name]) FOCUS[name](at);
    const hash = "#" + name + (at ? `@${at.rank}@${at.t_us}` : "");
    if (location.hash !== hash) history.replaceState(null, "", hash);  // no hashchange event
  }
  const goTo = (name, rank, t_us) => show(`${name}@${rank}@${t_us}`);
  for (const b of document.querySelectorAll("#ts-nav button")) b.addEventListener("click", () => show(b.dataset.view));

  // ---- charts -------------------------------------------------------------------------------------
  function stackedBars(rows, keys, label, title, left = 110) {  // rows: [{label, values: {key: us}}]
    const W = 900, barH = 16, gap = 4, H = rows.length * (barH + gap) + 24;
    const max = Math.max(1, ...rows.map((r) => keys.reduce((s, k) => s + (r.values[k] || 0), 0)));
    const svg = el("svg:svg", { viewBox: `0 0 ${W} ${H}`, width: "100%", role: "img", "aria-label": title });
    rows.forEach((r, i) => {
      const y = i * (barH + gap);
      svg.append(el("svg:text", { x: 0, y: y + barH - 4, text: label(r) }, el("svg:title", { text: r.title || label(r) })));
      let x = left;
      keys.forEach((k, j) => {
        const w = ((r.values[k] || 0) / max) * (W - left - 10);
        if (w > 0) svg.append(el("svg:rect", { x, y, width: w, height: barH, fill: color(k, j) },
          el("svg:title", { text: `${k}: ${fmtUs(r.values[k])}` })));
        x += w;
      });
    });
    svg.append(el("svg:text", { x: left, y: H - 4, text: "0" }), el("svg:text", { x: W - 70, y: H - 4, text: fmtUs(max) }));
    return svg;
  }
  const legend = (keys) => el("div", { class: "legend" }, ...keys.map((k, i) => el("span", { style: `--c:${color(k, i)}`, text: k })));

  function table(columns, rows, opts) {  // columns: [{key, title, num, fmt}]; sortable, filterable
    const state = { sort: opts.sort, desc: true, filter: "" };
    const tbody = el("tbody");
    const count = el("span", { class: "muted" });
    const heads = columns.map((c) => el("th", { class: "sortable" + (c.num ? " num" : ""), "data-key": c.key, text: c.title,
      onclick: () => { state.desc = state.sort === c.key ? !state.desc : !!c.num; state.sort = c.key; fill(); } }));
    function fill() {
      const f = state.filter.toLowerCase();
      let shown = rows.filter((r) => !f || columns.some((c) => !c.num && String(r[c.key] ?? "").toLowerCase().includes(f)));
      const k = state.sort;
      shown.sort((a, b) => { const x = a[k] ?? "", y = b[k] ?? ""; const d = x < y ? -1 : x > y ? 1 : 0; return state.desc ? -d : d; });
      const limit = 2000;  // the table shows the first rows; the filter reaches every row
      tbody.replaceChildren(...shown.slice(0, limit).map((r) => el("tr", null, ...columns.map((c) => c.node  // c.node: a cell built of elements
        ? el("td", { class: "name" }, c.node(r[c.key], r))
        : el("td", { class: c.num ? "num" : "name", text: c.fmt ? c.fmt(r[c.key], r) : (r[c.key] ?? "") })))));
      count.textContent = `${shown.length} of ${rows.length} rows` + (shown.length > limit ? ` (first ${limit} shown)` : "");
      heads.forEach((h, i) => { h.classList.toggle("sorted-desc", columns[i].key === k && state.desc); h.classList.toggle("sorted-asc", columns[i].key === k && !state.desc); });
    }
    const search = el("input", { type: "search", placeholder: "filter by name", "aria-label": "filter",
      oninput: (e) => { state.filter = e.target.value; fill(); } });
    fill();
    return el("div", null, el("div", { class: "controls" }, search, count, ...(opts.extra || [])),
      el("table", { class: "data" }, el("thead", null, el("tr", null, ...heads)), tbody));
  }

  // A call-site row's stack (R.call_sites[].stack, analysis/callsites.py): folded to its frame count, opened
  // to the frames, outermost first; where several stacks reach the site, the costliest and its share.
  function stackCell(stack, r) {
    if (!(stack || []).length) return "-";
    const share = r.stack_share > 0 && r.stack_share < 0.9995 ? `, ${pct(r.stack_share)} of this row's time; other callers too` : "";
    return el("details", { class: "ts-stack" }, el("summary", { text: `${stack.length} frame${stack.length > 1 ? "s" : ""}${share}` }),
      el("ol", { style: "margin:2px 0 0 1.4em;padding:0" }, ...stack.map((f) => el("li", { text: f }))));
  }

  // ---- overview -----------------------------------------------------------------------------------
  function overview(root) {
    const man = R.run.manifest || {};
    const versions = man.versions || {};
    root.append(card("Run",
      el("div", { class: "facts" },
        fact("device", R.device.present ? R.device.name || R.run.device_kind : R.run.device_kind),
        fact("torch", versions.torch || man.torch_version || "-"),
        fact("ranks", R.run.ranks.length), fact("steps", R.steps.length),
        fact("step source", R.run.step_source), fact("trace files", R.run.trace_files.length),
        fact("command", Array.isArray(man.command) ? man.command.join(" ") : man.command || "-"),
        fact("torchscope", R.torchscope_version)),
      R.run.partial ? el("p", { class: "muted", text: "Partial report: " + (R.warnings || []).join("; ") }) : null));
    const spread = metric("ranks.step_time_spread");
    root.append(card("Step time",
      el("div", { class: "facts" },
        fact("mean", fmtUs(metric("step_time.mean_us"))), fact("median", fmtUs(metric("step_time.median_us"))),
        fact("max", fmtUs(metric("step_time.max_us"))), fact("stdev", fmtUs(metric("step_time.stdev_us"))),
        fact("steps / s", metric("throughput.steps_per_s") == null ? "-" : metric("throughput.steps_per_s").toFixed(2)),
        spread == null ? null : fact("spread over ranks", pct(spread)))));
    const keys = Object.keys(R.breakdown || {});
    const steps = R.steps.slice(0, 200);
    root.append(card("Breakdown per step", legend(keys),
      stackedBars(steps.map((s) => ({ label: `rank ${s.rank} step ${s.step}`, values: s.breakdown })), keys, (r) => r.label, "breakdown per step"),
      R.steps.length > steps.length ? el("p", { class: "muted", text: `first ${steps.length} of ${R.steps.length} steps` }) : null,
      el("table", null, el("thead", null, el("tr", null, el("th", { text: "category" }), el("th", { class: "num", text: "mean per step" }), el("th", { class: "num", text: "share" }))),
        el("tbody", null, ...keys.map((k) => el("tr", null, el("td", { text: k }), el("td", { class: "num", text: fmtUs(R.breakdown[k].us) }), el("td", { class: "num", text: R.breakdown[k].percent.toFixed(1) + " %" })))))));
    if (R.device.present) {
      const d = R.device;
      root.append(card("Device", el("div", { class: "facts" },
        fact("GPU utilisation", pct(d.utilization)), fact("SM efficiency", pct(d.sm_efficiency)),
        fact("achieved occupancy", d.achieved_occupancy_pct == null ? "-" : d.achieved_occupancy_pct.toFixed(1) + " %"),
        fact("tensor-core kernel share", pct(d.tensor_core_kernel_share)), fact("kernels / step", d.kernels_per_step.toFixed(0)),
        fact("median kernel", fmtUs(d.median_kernel_us)), fact("memory", fmtBytes(d.total_memory_bytes)))));
    }
    const findings = R.findings || [];
    root.append(card(`Findings (${findings.length})`, findings.length ? null : el("p", { class: "muted", text: "No problem found." }),
      ...findings.map(finding)));
  }
  function finding(f) {
    const view = VIEW_OF[f.category] || "overview";
    const ev = Object.entries(f.evidence || {});
    return el("div", { class: "finding " + f.severity, "data-id": f.id },
      el("div", { class: "title", text: f.title }),
      el("div", { class: "meta", text: `${f.severity} · ${f.id} · cost ${f.time_share == null ? "no time cost" : pct(f.time_share) + " of step time"}` }),
      el("p", { text: f.recommendation }),
      ev.length ? el("table", null, el("tbody", null, ...ev.map(([k, v]) => el("tr", null, el("td", { text: k }),
        el("td", { class: "name", text: typeof v === "object" && v !== null ? JSON.stringify(v) : String(v) }))))) : null,
      (f.fixes || []).length ? el("ul", null, ...f.fixes.map((x) => el("li", { text: `${x.kind} ${x.target}${x.value == null ? "" : " = " + JSON.stringify(x.value)}${x.summary ? ": " + x.summary : ""}` }))) : null,
      el("a", { class: "goto", "data-view": view, text: `See the ${view} view`, onclick: () => show(view) }));
  }

  // ---- operators and kernels ----------------------------------------------------------------------
  function operators(root) {
    const cols = (shape) => [
      { key: "name", title: "operator" }, ...(shape ? [{ key: "input_shapes", title: "input shapes" }] : []),
      { key: "calls", title: "calls", num: true }, { key: "host_self_us", title: "host self", num: true, fmt: fmtUs },
      { key: "host_total_us", title: "host total", num: true, fmt: fmtUs }, { key: "device_self_us", title: "device self", num: true, fmt: fmtUs },
      { key: "device_total_us", title: "device total", num: true, fmt: fmtUs },
      ...(withFlops ? [{ key: "flops_per_s", title: "FLOP/s", num: true, fmt: fmtRate }] : [])];
    // OperatorRow.achieved_flops_per_s: FLOPs (from input shapes) over device time where the op launched
    // device work, else host time; "-" where the op's FLOPs are unknown.
    const withRate = (rows) => (rows || []).map((r) => {
      const seconds = (r.device_total_us || r.host_total_us) / 1e6;
      return { ...r, flops_per_s: r.flops != null && seconds > 0 ? r.flops / seconds : null };
    });
    const withFlops = (R.operators || []).some((r) => r.flops != null);
    const holder = el("div");
    const byShape = (R.operators_by_shape || []).length > 0;
    const toggle = el("select", { "aria-label": "group by", onchange: (e) => draw(e.target.value === "shape") },
      el("option", { value: "name", text: "group by operator" }), byShape ? el("option", { value: "shape", text: "group by operator + input shapes" }) : null);
    function draw(shape) { holder.replaceChildren(table(cols(shape), withRate(shape ? R.operators_by_shape : R.operators), { sort: "host_self_us", extra: [toggle] })); }
    root.append(card("Operators", holder));
    draw(false);
    const stacked = (R.call_sites || []).some((r) => (r.stack || []).length);
    if ((R.call_sites || []).length) root.append(card("Where the top operators are called from (innermost frame of your code)", table([
      { key: "operator", title: "operator" }, { key: "site", title: "call site" }, { key: "calls", title: "calls", num: true },
      { key: "host_self_us", title: "host self", num: true, fmt: fmtUs }, { key: "device_self_us", title: "device self", num: true, fmt: fmtUs },
      ...(stacked ? [{ key: "stack", title: "call stack (your code, outermost first)", node: stackCell }] : [])],
      R.call_sites, { sort: "host_self_us" })));
    if ((R.modules || []).length) root.append(card("Modules (nn.Module forward, per step)", table([
      { key: "path", title: "module path" }, { key: "module", title: "class" }, { key: "calls_per_step", title: "calls/step", num: true, fmt: (v) => v.toFixed(1) },
      { key: "host_us_per_step", title: "host incl.", num: true, fmt: fmtUs }, { key: "host_self_us_per_step", title: "host self", num: true, fmt: fmtUs },
      { key: "device_us_per_step", title: "device", num: true, fmt: fmtUs }], R.modules, { sort: "host_us_per_step" })));
    if ((R.ranges || []).length) root.append(card("record_function ranges", table([{ key: "name", title: "range" },
      { key: "calls", title: "calls", num: true }, { key: "total_us", title: "total", num: true, fmt: fmtUs },
      { key: "mean_us", title: "mean", num: true, fmt: fmtUs }], R.ranges, { sort: "total_us" })));
  }
  function kernels(root) {
    const rows = R.kernels || [];
    if (!rows.length) { root.append(card("Kernels", el("p", { class: "muted", text: "No device kernels in this trace (a CPU run)." }))); return; }
    const top = rows.slice().sort((a, b) => b.total_us - a.total_us).slice(0, 10);
    root.append(card("Top kernels by total time", stackedBars(top.map((k) => ({ label: k.name.length > 44 ? k.name.slice(0, 43) + "…" : k.name, title: k.name, values: { kernel: k.total_us } })), ["kernel"], (r) => r.label, "top kernels", 300)));
    root.append(card("Kernels", table([{ key: "name", title: "kernel" }, { key: "calls", title: "calls", num: true },
      { key: "total_us", title: "total", num: true, fmt: fmtUs }, { key: "mean_us", title: "mean", num: true, fmt: fmtUs },
      { key: "min_us", title: "min", num: true, fmt: fmtUs }, { key: "max_us", title: "max", num: true, fmt: fmtUs },
      { key: "mean_blocks_per_sm", title: "blocks/SM", num: true, fmt: (v) => (v == null ? "-" : v.toFixed(2)) },
      { key: "mean_occupancy_pct", title: "occupancy", num: true, fmt: (v) => (v == null ? "-" : v.toFixed(1) + " %") },
      { key: "tensor_core", title: "tensor cores", num: true, fmt: (v) => (v ? "yes" : "no") },
      { key: "launched_by", title: "launched by" }], rows, { sort: "total_us" })));
  }

  // ---- timeline -----------------------------------------------------------------------------------
  function timeline(root) {
    const T = SIDE.timeline;
    if (!T || !T.lanes.length) { root.append(card("Timeline", el("p", { class: "muted", text: "No timeline data in this report (rendered without the timeline sidecar)." }))); return; }
    const ROW = 14, HEAD = 18, LABEL = 190;
    const lanes = T.lanes.map((l) => {  // events come in time order (the phases lane: sorted here)
      let order = null;
      for (let i = 1; i < l.start_us.length && !order; i++) if (l.start_us[i] < l.start_us[i - 1]) order = true;
      if (order) {
        const idx = l.start_us.map((_, i) => i).sort((a, b) => l.start_us[a] - l.start_us[b]);
        for (const key of ["start_us", "dur_us", "name", "depth", "detail", "correlation"]) if (l[key] && l[key].length) l[key] = idx.map((i) => l[key][i]);
      }
      let depth = 0, longest = 0;
      for (let i = 0; i < l.start_us.length; i++) { depth = Math.max(depth, l.depth[i]); longest = Math.max(longest, l.dur_us[i]); }
      return Object.assign(l, { rows: depth + 1, longest });
    });
    let y = HEAD;
    for (const l of lanes) { l.y = y; y += (l.rows + (l.hidden_count.length ? 1 : 0)) * ROW + 6; }
    const height = y + 4;
    // Launch-to-kernel flows: events of one rank sharing a correlation id (a runtime call and its kernel).
    const flows = new Map();
    for (const l of lanes) (l.correlation || []).forEach((c, i) => { if (c) {
      const key = `${l.rank}:${c}`; if (!flows.has(key)) flows.set(key, []); flows.get(key).push({ l, i }); } });
    const partners = (s) => (s.l.correlation && s.l.correlation[s.i] ? flows.get(`${s.l.rank}:${s.l.correlation[s.i]}`).filter((p) => p.l !== s.l || p.i !== s.i) : []);
    let selected = null;
    let end = 0;
    for (const l of lanes) for (let i = 0; i < l.start_us.length; i++) end = Math.max(end, l.start_us[i] + l.dur_us[i]);
    const full = { start: 0, end: Math.max(end, 1) };
    const view = { start: full.start, end: full.end };
    const canvas = el("canvas", { id: "ts-timeline", height: String(height),
      "data-lanes": lanes.map((l) => `${l.kind}:${l.y}`).join(",") });
    const details = el("div", { id: "ts-details", text: "Click an event for its details." });
    const range = el("span", { class: "muted", id: "ts-range" });
    const zoom = (f, at) => { const c = at == null ? (view.start + view.end) / 2 : at; const w = Math.max((view.end - view.start) * f, 1);
      view.start = c - (c - view.start) * f; view.end = view.start + w; draw(); };
    const pan = (f) => { const d = (view.end - view.start) * f; view.start += d; view.end += d; draw(); };
    const btn = (text, fn, id) => el("button", { id, onclick: fn, text });
    const perfetto = el("a", { href: "https://ui.perfetto.dev/", target: "_blank", rel: "noopener noreferrer",
      text: "Open Perfetto (online: opens ui.perfetto.dev; load the raw trace file there yourself, nothing is sent from this page)" });
    root.append(card("Timeline",
      el("div", { class: "controls" }, btn("Zoom in", () => zoom(0.5), "ts-zoom-in"), btn("Zoom out", () => zoom(2), "ts-zoom-out"),
        btn("◀ Pan", () => pan(-0.25), "ts-pan-left"), btn("Pan ▶", () => pan(0.25), "ts-pan-right"),
        btn("Reset", () => { view.start = full.start; view.end = full.end; draw(); }, "ts-reset"), range),
      el("p", { class: "muted", text: `${T.shown} of ${T.events} events drawn; the others (the shortest) are counted in the grey density band under their lane. ` +
        "Events narrower than a pixel at this zoom are merged into one pixel. Wheel: zoom; drag: pan; click: details. Vertical lines: step starts." }),
      T.clock_note ? el("p", { class: "muted", id: "ts-clock-note", text: T.clock_note }) : null,
      el("div", { id: "ts-timeline-wrap" }, canvas), el("h2", { text: "Event" }), details, el("p", null, perfetto)));
    const ctx = canvas.getContext("2d");
    const shift = T.clock_shift_us || {};  // per rank: its clock offset, already taken off its lanes' times
    const steps = (R.steps || []).map((s) => ({ t: s.start_us - T.origin_us - (shift[s.rank] || 0), label: `step ${s.step}`, rank: s.rank }));
    // Links to the memory view: a time here is on the aligned clock; the memory view counts on each rank's own.
    let cursor = null;  // a time another view sent us to, drawn as a blue line
    const toTrace = (t, rank) => t + T.origin_us + (shift[rank] || 0);
    FOCUS.timeline = (at) => {
      cursor = at.t_us - T.origin_us - (shift[at.rank] || 0);
      const half = (full.end - full.start) / 20;
      view.start = cursor - half; view.end = cursor + half; canvas.dataset.cursor = String(cursor); draw();
    };
    const memoryLink = (t, rank) => (R.memory && R.memory.present
      ? el("button", { id: "ts-to-memory", text: "See memory at this time", onclick: () => goTo("memory", rank, toTrace(t, rank)) }) : null);
    function xOf(t, w) { return LABEL + ((t - view.start) / (view.end - view.start)) * (w - LABEL); }
    function draw() {
      const w = canvas.clientWidth || 1000; canvas.width = w;
      canvas.dataset.start = String(view.start); canvas.dataset.end = String(view.end);
      range.textContent = `${fmtUs(view.start)} – ${fmtUs(view.end)} (${fmtUs(view.end - view.start)} shown)`;
      ctx.clearRect(0, 0, w, height); ctx.font = "11px sans-serif";
      for (const l of lanes) drawLane(l, w);
      ctx.strokeStyle = "rgba(229,62,62,0.7)"; ctx.fillStyle = "#c53030";
      for (const s of steps) { const x = xOf(s.t, w); if (x < LABEL || x > w) continue;
        ctx.beginPath(); ctx.moveTo(x + 0.5, 0); ctx.lineTo(x + 0.5, height); ctx.stroke(); ctx.fillText(s.label, x + 2, 11); }
      if (selected) drawSelection(w);
      if (cursor != null) { const x = xOf(cursor, w); ctx.strokeStyle = "#2b6cb0"; ctx.lineWidth = 2;
        ctx.beginPath(); ctx.moveTo(x, 0); ctx.lineTo(x, height); ctx.stroke(); ctx.lineWidth = 1; }
      ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, LABEL, height);
      ctx.fillStyle = "#1d2433";
      for (const l of lanes) ctx.fillText(`r${l.rank} ${l.label}`.slice(0, 32), 4, l.y + 11);
    }
    function centre(s, w) {
      const x0 = Math.max(xOf(s.l.start_us[s.i], w), LABEL), x1 = Math.min(xOf(s.l.start_us[s.i] + s.l.dur_us[s.i], w), w);
      return { x0, x1, y: s.l.y + s.l.depth[s.i] * ROW };
    }
    function drawSelection(w) {  // the selected event outlined, and an arrow to each event of its flow
      const a = centre(selected, w);
      ctx.strokeStyle = "#000"; ctx.lineWidth = 2; ctx.strokeRect(a.x0, a.y, Math.max(a.x1 - a.x0, 2), ROW - 2);
      for (const p of partners(selected)) {
        const b = centre(p, w), [from, to] = p.l.kind === "device" ? [a, b] : [b, a];
        ctx.strokeStyle = "#1d2433"; ctx.lineWidth = 1.5; ctx.beginPath();
        ctx.moveTo(from.x0, from.y + ROW - 2); ctx.lineTo(to.x0, to.y); ctx.stroke();
        ctx.beginPath(); ctx.arc(to.x0, to.y, 3, 0, 2 * Math.PI); ctx.fillStyle = "#1d2433"; ctx.fill();
      }
      ctx.lineWidth = 1;
    }
    function drawLane(l, w) {
      const last = new Float64Array(l.rows).fill(-1);
      const starts = l.start_us;
      let lo = 0, hi = starts.length;  // the first event that may reach into the view: binary search
      while (lo < hi) { const mid = (lo + hi) >> 1; if (starts[mid] < view.start - l.longest) lo = mid + 1; else hi = mid; }
      for (let i = lo; i < starts.length && starts[i] <= view.end; i++) {
        const s = starts[i], e = s + l.dur_us[i];
        if (e < view.start) continue;
        const x0 = Math.max(xOf(s, w), LABEL), x1 = Math.min(xOf(e, w), w), d = l.depth[i];
        if (x1 - x0 < 1) { const px = Math.floor(x0); if (px === last[d]) continue; last[d] = px; }  // merged into its pixel
        ctx.fillStyle = color(l.kind === "phase" ? T.strings[l.name[i]] : null, l.name[i]);
        ctx.fillRect(x0, l.y + d * ROW, Math.max(x1 - x0, 1), ROW - 2);
        if (x1 - x0 > 40) { ctx.fillStyle = "#fff"; ctx.fillText(T.strings[l.name[i]].slice(0, Math.floor((x1 - x0) / 6)), x0 + 2, l.y + d * ROW + 10); }
      }
      if (l.hidden_count.length) {
        const yb = l.y + l.rows * ROW, width = (full.end - full.start) / 1000;
        for (let i = 0; i < l.hidden_count.length; i++) {
          const x0 = xOf(l.hidden_start_us[i], w), x1 = xOf(l.hidden_start_us[i] + width, w);
          if (x1 < LABEL || x0 > w) continue;
          ctx.fillStyle = `rgba(90,100,120,${Math.min(0.15 + l.hidden_us[i] / width, 0.9)})`;
          ctx.fillRect(Math.max(x0, LABEL), yb, Math.max(x1 - Math.max(x0, LABEL), 1), ROW - 4);
        }
      }
    }
    function hit(px, py) {
      const w = canvas.clientWidth; const t = view.start + ((px - LABEL) / (w - LABEL)) * (view.end - view.start);
      const tol = (view.end - view.start) / (w - LABEL) * 2;
      for (const l of lanes) {
        const d = Math.floor((py - l.y) / ROW); if (d < 0 || d >= l.rows) continue;
        let best = -1;
        for (let i = 0; i < l.start_us.length; i++) if (l.depth[i] === d && l.start_us[i] - tol <= t && t <= l.start_us[i] + l.dur_us[i] + tol) {
          if (best < 0 || l.dur_us[i] < l.dur_us[best]) best = i; }
        if (best >= 0) return { l, i: best };
      }
      return null;
    }
    let drag = null;
    canvas.addEventListener("mousedown", (e) => { drag = { x: e.offsetX, start: view.start, end: view.end, moved: false }; });
    window.addEventListener("mouseup", () => { setTimeout(() => { drag = null; }, 0); });
    canvas.addEventListener("mousemove", (e) => { if (!drag || !(e.buttons & 1)) return; const dx = e.offsetX - drag.x;
      if (Math.abs(dx) > 2) drag.moved = true; const d = (dx / (canvas.clientWidth - LABEL)) * (drag.end - drag.start);
      view.start = drag.start - d; view.end = drag.end - d; draw(); });
    canvas.addEventListener("wheel", (e) => { e.preventDefault(); const w = canvas.clientWidth;
      const at = view.start + ((e.offsetX - LABEL) / (w - LABEL)) * (view.end - view.start); zoom(e.deltaY < 0 ? 0.8 : 1.25, at); }, { passive: false });
    canvas.addEventListener("click", (e) => {
      if (drag && drag.moved) return;
      const found = hit(e.offsetX, e.offsetY);
      if (!found) {  // an empty spot: its time, and its memory
        const t = view.start + ((e.offsetX - LABEL) / (canvas.clientWidth - LABEL)) * (view.end - view.start);
        const lane = lanes.filter((l) => e.offsetY >= l.y).pop() || lanes[0];
        if (e.offsetX < LABEL || !lane) return;
        details.textContent = `time: ${fmtUs(t)} (rank ${lane.rank})`;
        const link = memoryLink(t, lane.rank); if (link) details.append(" ", link);
        return;
      }
      const { l, i } = found;
      selected = found;
      const flow = partners(found).map((p) => `${p.l.kind === "device" ? "launches" : "launched by"}: ${T.strings[p.l.name[p.i]]} (${p.l.label}, at ${fmtUs(p.l.start_us[p.i])})`);
      details.textContent = [`name: ${T.strings[l.name[i]]}`, `lane: rank ${l.rank} ${l.label}`, `start: ${fmtUs(l.start_us[i])}`,
        `duration: ${fmtUs(l.dur_us[i])}`, ...flow, T.strings[l.detail[i]] || ""].filter(Boolean).join("\n");
      const link = memoryLink(l.start_us[i], l.rank); if (link) details.append("\n", link);
      draw();
    });
    window.addEventListener("resize", draw);
    draw();
  }

  // ---- memory and distributed ---------------------------------------------------------------------
  function modules(root) {  // render/assets/view_modules.js
    window.tsModulesView(root, R, { el, card, table, fmtUs });
  }
  function memory(root) {  // render/assets/view_memory.js
    window.tsMemoryView(root, R, { el, card, fact, fmtBytes, fmtUs, goTo, focus: (f) => { FOCUS.memory = f; },
      timeline: !!(SIDE.timeline && SIDE.timeline.lanes.length) });
  }
  function distributed(root) {  // render/assets/view_distributed.js when collectives were matched across ranks
    if (R.distributed && R.distributed.present) return window.tsDistributedView(root, R, { el, card, fact, table, fmtUs });
    const ranks = R.ranks || [];
    if (ranks.length < 2) root.append(card("Distributed", el("p", { class: "muted", text: `One rank in this run: nothing to compare.` })));
    if (!ranks.length) return;
    const keys = Object.keys(ranks[0].breakdown_us);
    const slowest = ranks.reduce((a, b) => (b.mean_step_us > a.mean_step_us ? b : a));
    root.append(card("Per-rank breakdown (mean per step)", legend(keys),
      stackedBars(ranks.map((r) => ({ label: `rank ${r.rank}`, values: r.breakdown_us })), keys, (r) => r.label, "per-rank breakdown")));
    root.append(card("Ranks", table([{ key: "rank", title: "rank", num: true }, { key: "worker", title: "worker" },
      { key: "steps", title: "steps", num: true }, { key: "mean_step_us", title: "mean step", num: true, fmt: fmtUs },
      { key: "comm_us_per_step", title: "communication / step", num: true, fmt: fmtUs },
      { key: "compute_us_per_step", title: "computation / step", num: true, fmt: fmtUs }], ranks, { sort: "rank" }),
      ranks.length > 1 ? el("p", { text: `Slowest rank: ${slowest.rank} (${fmtUs(slowest.mean_step_us)} per step).` }) : null));
  }

  document.getElementById("ts-subtitle").textContent = `${R.run.device_kind} · ${R.run.ranks.length} rank(s) · ${R.steps.length} step(s) · ${(R.run.paths || []).join(", ")}`;
  window.addEventListener("hashchange", () => show(location.hash.slice(1)));
  show(location.hash.slice(1));
})();
