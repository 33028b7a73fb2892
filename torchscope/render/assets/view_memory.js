// torchscope dashboard, Memory view: per device, allocated and reserved memory over time with the peak
// marked (its step, phase and operator), what is alive at the peak, growth across steps (a leak) and the
// temporaries made and freed inside each step (churn). dashboard.js calls it with its helpers; every
// string from the data goes in through textContent (h.el), never innerHTML.
"use strict";
window.tsMemoryView = function (root, R, h) {
  const M = R.memory;
  const { el, card, fact, fmtBytes, fmtUs } = h;
  if (!M.present) {
    root.append(card("Memory", el("p", { class: "muted", text: "No memory events in this trace (profile with profile_memory=True)." })));
    return;
  }
  const memoryFindings = (R.findings || []).filter((f) => f.category === "memory");
  if (memoryFindings.length) {
    root.append(card("Memory findings", el("ul", null, ...memoryFindings.map((f) => el("li", { text: `${f.severity}: ${f.title}` })))));
  }
  const charts = [];  // {dev, svg, x, t0, t1}: where a time from the timeline is marked
  for (const dev of Object.keys(M.peak_allocated_bytes)) root.append(deviceCard(dev));
  if (h.focus) h.focus(markTime);

  // A time sent from the timeline (`at.t_us` on rank `at.rank`'s trace clock) marked on that rank's charts.
  function markTime(at) {
    let first = null;
    for (const c of charts) {
      for (const old of c.svg.querySelectorAll(".cursor")) old.remove();
      const rank = (M.timeline_rank || {})[c.dev];
      if (rank != null && rank !== at.rank) continue;
      const t = at.t_us - ((M.timeline_origin_us || {})[c.dev] || 0);
      const inside = t >= c.t0 && t <= c.t1, px = c.x(Math.min(Math.max(t, c.t0), c.t1));
      c.svg.dataset.cursorTUs = String(t);
      c.svg.append(el("svg:line", { x1: px, x2: px, y1: 10, y2: 196, stroke: "#2b6cb0", "stroke-width": 2, class: "cursor" },
        el("svg:title", { text: "the time chosen in the timeline" })),
        el("svg:text", { x: Math.min(px + 4, 640), y: 60, class: "cursor", fill: "#2b6cb0",
          text: inside ? `timeline: ${fmtUs(t)}` : `timeline: ${fmtUs(t)} (outside this chart)` }));
      first = first || c.svg;
    }
    let note = root.querySelector("#ts-memory-cursor-note");
    if (!note) { note = el("p", { class: "muted", id: "ts-memory-cursor-note" }); root.prepend(note); }
    // The charts are one rank's (the first with memory events): say so rather than mark another rank's time.
    note.textContent = first ? "" : `The time chosen in the timeline is on rank ${at.rank}; these charts are rank ${Object.values(M.timeline_rank || {}).join(", ")}'s.`;
    if (first) first.scrollIntoView({ block: "center" });
  }

  function deviceCard(dev) {
    const peak = (M.peaks || {})[dev];
    const fit = (M.growth || {})[dev];
    const rows = (M.per_step || []).filter((r) => r.device === dev);
    const temporaries = rows.length && M.has_addresses ? rows.reduce((s, r) => s + r.temporary_bytes, 0) / rows.length : null;
    const where = peak ? [peak.step == null ? "outside steps" : `step ${peak.step}`, peak.phase, peak.operator].filter((x) => x).join(", ") : "-";
    const facts = el("div", { class: "facts" },
      fact("peak allocated", fmtBytes(M.peak_allocated_bytes[dev])),
      fact("peak reserved", fmtBytes((M.peak_reserved_bytes || {})[dev])),
      fact("at the peak", where),
      fact("call site at the peak", peak && peak.call_site ? peak.call_site : "-"),
      fact("growth per step", fit && fit.boundaries >= 3 ? `${fmtBytes(fit.bytes_per_step)} (90 %: ${fmtBytes(fit.low_bytes_per_step)} to ${fmtBytes(fit.high_bytes_per_step)}, R² ${fit.r2.toFixed(2)})` : "-"),
      fact("temporaries per step", temporaries == null ? "-" : fmtBytes(temporaries)));
    const parts = [facts, chart(dev, peak)];
    if (peak && h.timeline) parts.push(el("p", null, el("button", { class: "ts-peak-to-timeline", text: "See the peak in the timeline",
      onclick: () => h.goTo("timeline", peak.rank, (peak.origin_us || 0) + peak.t_us) })));
    if (peak && Object.keys(peak.alive_by_call_site || {}).length) parts.push(bytesTable("Alive at the peak, by call site", peak.alive_by_call_site, "call site"));
    if (peak && Object.keys(peak.alive_by_operator || {}).length) parts.push(bytesTable("Alive at the peak, by operator", peak.alive_by_operator, "operator"));
    if (peak && peak.unattributed_bytes) parts.push(el("p", { class: "muted", text: `${fmtBytes(peak.unattributed_bytes)} of the peak was allocated before the capture (or the trace has no block addresses).` }));
    const doubted = fit && fit.doubtful_bytes_per_step > 0;
    if (fit && (fit.unrecorded_frees || doubted)) parts.push(el("p", { class: "muted ts-unrecorded-frees", text: [
      fit.unrecorded_frees ? `The trace misses frees here: ${fit.unrecorded_frees} block(s) were allocated again at an address it still held (freed on a thread the profiler does not follow); where the allocator counts only what the trace recorded (the CPU), they are taken off the allocated total from then on.` : "",
      doubted ? `${fmtBytes(fit.doubtful_bytes_per_step)} per step of blocks never freed in the trace may have gone the same way (of a size whose free went missing, or a collective's buffer): they are left out of the table below${fit.boundaries >= 3 && fit.leak_bytes_per_step !== fit.bytes_per_step ? `, and without them the allocated total grows ${fmtBytes(fit.leak_bytes_per_step)} per step (the line a leak is judged on)` : ""}.` : "",
    ].filter((x) => x).join(" ") }));
    if (fit && Object.keys(fit.surviving_by_call_site || {}).length) parts.push(bytesTable("Kept each step (allocated in a step, alive at the end of the last), per step", fit.surviving_by_call_site, "call site"));
    if (rows.length) parts.push(stepTable(rows));
    return card(`Memory: ${dev}`, ...parts);
  }

  function chart(dev, peak) {
    const allocated = (M.timeline || {})[dev] || [];
    const reserved = (M.reserved_timeline || {})[dev] || [];
    if (!allocated.length) return el("p", { class: "muted", text: "no timeline" });
    const W = 900, H = 220, L = 70, B = 24, T = 10;
    const all = allocated.concat(reserved);
    const t0 = Math.min(...all.map((p) => p[0])), t1 = Math.max(...all.map((p) => p[0]), t0 + 1);
    const top = Math.max(1, ...all.map((p) => p[1]));
    const x = (t) => L + ((t - t0) / (t1 - t0)) * (W - L - 10);
    const y = (v) => T + (1 - v / top) * (H - T - B);
    const line = (points) => points.map((p, i) => `${i ? "L" : "M"}${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`).join("");
    const svg = el("svg:svg", { viewBox: `0 0 ${W} ${H}`, width: "100%", role: "img", class: "ts-memory-chart",
      "data-device": dev, "aria-label": `allocated and reserved memory on ${dev} over time` });
    charts.push({ dev, svg, x, t0, t1 });
    svg.append(el("svg:text", { x: 0, y: T + 10, text: fmtBytes(top) }), el("svg:text", { x: 0, y: H - B, text: "0" }),
      el("svg:text", { x: L, y: H - 4, text: fmtUs(t0) }), el("svg:text", { x: W - 90, y: H - 4, text: fmtUs(t1) }));
    if (reserved.length) svg.append(el("svg:path", { d: line(reserved), fill: "none", stroke: "#dd6b20", "stroke-width": 1.5, class: "reserved" }, el("svg:title", { text: "reserved" })));
    svg.append(el("svg:path", { d: line(allocated), fill: "none", stroke: "#3182ce", "stroke-width": 1.5, class: "allocated" }, el("svg:title", { text: "allocated" })));
    if (peak) {
      const px = x(peak.t_us), py = y(peak.allocated_bytes);
      const label = `peak ${fmtBytes(peak.allocated_bytes)}` + (peak.operator ? ` in ${peak.operator}` : "");
      svg.append(el("svg:line", { x1: px, x2: px, y1: T, y2: H - B, stroke: "#e53e3e", "stroke-dasharray": "4 3", class: "peak",
        "data-t-us": String(peak.t_us) }, el("svg:title", { text: label + (h.timeline ? " (click: see it in the timeline)" : "") })),
        el("svg:circle", Object.assign({ cx: px, cy: py, r: 5, fill: "#e53e3e", class: "peak-dot" }, h.timeline
          ? { style: "cursor:pointer", onclick: () => h.goTo("timeline", peak.rank, (peak.origin_us || 0) + peak.t_us) } : {})),
        el("svg:text", { x: Math.min(px + 6, W - 260), y: T + 24, class: "peak-label", text: label }));
    }
    const legend = el("div", { class: "legend" }, el("span", { style: "--c:#3182ce", text: "allocated" }),
      reserved.length ? el("span", { style: "--c:#dd6b20", text: "reserved" }) : null, el("span", { style: "--c:#e53e3e", text: "peak" }));
    return el("div", null, legend, svg);
  }

  function bytesTable(title, values, what) {
    return el("div", null, el("h3", { text: title }), el("table", { class: "data" },
      el("thead", null, el("tr", null, el("th", { class: "num", text: "bytes" }), el("th", { text: what }))),
      el("tbody", null, ...Object.entries(values).map(([name, bytes]) =>
        el("tr", null, el("td", { class: "num", text: fmtBytes(bytes) }), el("td", { class: "name", text: name }))))));
  }

  function stepTable(rows) {
    const cols = [["step", (r) => String(r.step)], ["rank", (r) => String(r.rank)], ["at start", (r) => fmtBytes(r.allocated_at_start_bytes)],
      ["at end", (r) => fmtBytes(r.allocated_at_end_bytes)], ["allocated", (r) => `${fmtBytes(r.alloc_bytes)} (${r.alloc_count})`],
      ["freed", (r) => `${fmtBytes(r.free_bytes)} (${r.free_count})`], ["temporaries", (r) => fmtBytes(r.temporary_bytes)]];
    return el("div", null, el("h3", { text: "Per step (churn: allocated and freed inside the step)" }), el("table", { class: "data ts-memory-steps" },
      el("thead", null, el("tr", null, ...cols.map(([name]) => el("th", { class: "num", text: name })))),
      el("tbody", null, ...rows.slice(0, 500).map((r) => el("tr", null, ...cols.map(([, f]) => el("td", { class: "num", text: f(r) })))))));
  }
};
