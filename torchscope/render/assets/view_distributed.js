// torchscope dashboard, Distributed view: the rank the others wait for and why, waiting vs transfer in the
// collectives, a rank heat map per metric (min / median / max and the highest ranks named, readable at
// 1,024 ranks), the ranks side by side in a sortable table, and the collectives. dashboard.js calls it
// with its helpers; every string from the data goes in through textContent (h.el), never innerHTML.
"use strict";
window.tsDistributedView = function (root, R, h) {
  const D = R.distributed;
  const { el, card, fact, table, fmtUs } = h;
  const ms = (us) => (us == null ? "-" : fmtUs(us));
  const pctv = (v) => (v == null ? "-" : v.toFixed(1) + " %");
  const PHASES = ["data_loading", "forward", "backward", "optimizer", "other"];
  const rows = D.ranks.map((r) => Object.assign({}, r, Object.fromEntries(PHASES.map((p) => ["phase_" + p, (r.phases_us_per_step || {})[p] || 0]))));

  const related = (R.findings || []).filter((f) => f.category === "straggler" || f.category === "communication");
  if (related.length) root.append(card("Findings across ranks", el("ul", null, ...related.map((f) => el("li", { text: `${f.severity}: ${f.title}` })))));

  const S = D.straggler;
  const how = { sequence: "by process group and sequence number", order: "by step, group, name and order (no sequence numbers)", none: "-" };
  root.append(card("Collectives across ranks", el("div", { class: "facts" },
    fact("ranks", D.world_size), fact("collectives matched", `${D.matched} ${how[D.match_method] || ""}`),
    fact("timed by", D.source), fact("waiting for the last rank / step", ms(D.wait_us_per_step)),
    fact("transfer / step", ms(D.transfer_us_per_step)), fact("transfer not overlapped / step", ms(D.exposed_transfer_us_per_step)),
    fact("straggler", S ? `rank ${S.rank}` : "none")),
    ...(D.notes || []).map((n) => el("p", { class: "muted", text: n }))));

  if (S) {
    const culprits = Object.entries(S.culprits_us_per_step || {});
    root.append(card(`Why rank ${S.rank} is late`, el("div", { class: "facts" },
      fact("late by (median step)", ms(S.median_lateness_us)), fact("last in", `${S.late_steps} of ${S.steps} steps`),
      fact("late phase", S.late_phase || "-")),
      table([{ key: "phase", title: "phase" }, { key: "us", title: "more than the median other rank / step", num: true, fmt: ms }],
        Object.entries(S.phase_excess_us_per_step || {}).map(([phase, us]) => ({ phase, us })), { sort: "us" }),
      culprits.length ? table([{ key: "name", title: "culprit (operator or Python frame)" }, { key: "us", title: "extra time / step", num: true, fmt: ms }],
        culprits.map(([name, us]) => ({ name, us })), { sort: "us" }) : null,
      table([{ key: "step", title: "step", num: true }, { key: "us", title: "late by", num: true, fmt: ms }],
        Object.entries(S.lateness_us_by_step || {}).map(([step, us]) => ({ step: Number(step), us })), { sort: "step" })));
  }

  root.append(card("Rank heat map (per step; darker = higher)", ...heatMaps()));

  root.append(card("Ranks side by side (per step)", table([
    { key: "rank", title: "rank", num: true }, { key: "step_us", title: "step", num: true, fmt: ms },
    { key: "phase_data_loading", title: "data", num: true, fmt: ms }, { key: "phase_forward", title: "forward", num: true, fmt: ms },
    { key: "phase_backward", title: "backward", num: true, fmt: ms }, { key: "phase_optimizer", title: "optimizer", num: true, fmt: ms },
    { key: "phase_other", title: "outside", num: true, fmt: ms }, { key: "comm_us_per_step", title: "in collectives", num: true, fmt: ms },
    { key: "wait_us_per_step", title: "waiting", num: true, fmt: ms }, { key: "transfer_us_per_step", title: "transfer", num: true, fmt: ms },
    { key: "exposed_transfer_us_per_step", title: "transfer not overlapped", num: true, fmt: ms },
    { key: "lateness_us_per_step", title: "late by", num: true, fmt: ms }, { key: "clock_offset_us", title: "clock offset", num: true, fmt: ms },
    { key: "idle_pct", title: "device idle", num: true, fmt: pctv }, { key: "compute_pct", title: "device compute", num: true, fmt: pctv },
    { key: "non_compute_pct", title: "device non-compute", num: true, fmt: pctv },
    { key: "comm_compute_overlap_pct", title: "comm/compute overlap", num: true, fmt: pctv },
  ], rows, { sort: "lateness_us_per_step" })));

  // GPU traces: the share of each rank's communication overlapped by compute, step by step (the Report's
  // overlap_pct_by_step; a step a rank has no collective in shows "-").
  const overlapSteps = [...new Set(D.ranks.flatMap((r) => Object.keys(r.overlap_pct_by_step || {})))]
    .sort((a, b) => Number(a) - Number(b) || (a < b ? -1 : a > b ? 1 : 0));
  if (overlapSteps.length) {
    const byStep = D.ranks.map((r) => Object.assign({ rank: r.rank, all: r.comm_compute_overlap_pct },
      Object.fromEntries(overlapSteps.map((s) => ["step_" + s, (r.overlap_pct_by_step || {})[s]]))));
    root.append(card("Communication overlapped by compute, per step (% of the rank's time in collectives)", table([
      { key: "rank", title: "rank", num: true }, { key: "all", title: "whole run", num: true, fmt: pctv },
      ...overlapSteps.map((s) => ({ key: "step_" + s, title: `step ${s}`, num: true, fmt: pctv })),
    ], byStep, { sort: "rank" })));
  }

  if ((D.collectives || []).length) {
    root.append(card("Collectives", table([{ key: "name", title: "collective" }, { key: "group", title: "process group" },
      { key: "calls", title: "calls", num: true }, { key: "ranks", title: "ranks", num: true },
      { key: "mean_transfer_us", title: "transfer / call", num: true, fmt: ms }, { key: "mean_wait_us", title: "waiting / call and rank", num: true, fmt: ms },
      { key: "mean_nelems", title: "elements", num: true, fmt: (v) => (v ? Math.round(v).toLocaleString() : "-") }], D.collectives, { sort: "mean_wait_us" })));
  }

  // One grid of rank cells per metric: 64 ranks a row, so 1,024 ranks are 16 rows of small cells; each
  // cell's tooltip gives its rank and value, and the line above names the extremes.
  function heatMaps() {
    const metrics = [
      ["step_us", "step", ms], ["comm_us_per_step", "in collectives", ms], ["wait_us_per_step", "waiting", ms],
      ["exposed_transfer_us_per_step", "transfer not overlapped", ms], ["lateness_us_per_step", "late by", ms],
      ["phase_data_loading", "data loading", ms], ["phase_forward", "forward", ms], ["phase_other", "outside the phases", ms],
      ["idle_pct", "device idle", pctv], ["compute_pct", "device compute", pctv], ["non_compute_pct", "device non-compute", pctv],
      ["comm_compute_overlap_pct", "comm/compute overlap", pctv],
    ];
    const perRow = Math.min(64, rows.length), cell = rows.length > 256 ? 8 : 14;
    return metrics.filter(([key]) => rows.some((r) => r[key] != null)).map(([key, label, fmt]) => {
      const values = rows.map((r) => r[key]).filter((v) => v != null).sort((a, b) => a - b);
      const lo = values[0], hi = values[values.length - 1], mid = values[Math.floor((values.length - 1) / 2)];
      const worst = rows.filter((r) => r[key] != null).sort((a, b) => b[key] - a[key]).slice(0, 3).map((r) => r.rank);
      const lines = Math.ceil(rows.length / perRow);
      const svg = el("svg:svg", { viewBox: `0 0 ${perRow * cell} ${lines * cell}`, width: Math.min(perRow * cell, 900), class: "ts-heat",
        role: "img", "aria-label": `${label} by rank` });
      rows.forEach((r, i) => {
        const v = r[key];
        const t = v == null || hi === lo ? 0 : (v - lo) / (hi - lo);
        const rect = el("svg:rect", { x: (i % perRow) * cell, y: Math.floor(i / perRow) * cell, width: cell - 1, height: cell - 1,
          fill: v == null ? "#edf2f7" : `rgb(${Math.round(254 - 33 * t)},${Math.round(235 - 160 * t)},${Math.round(200 - 180 * t)})`,
          "data-rank": r.rank });
        rect.append(el("svg:title", { text: `rank ${r.rank}: ${fmt(v)}` }));
        svg.append(rect);
      });
      return el("div", { class: "ts-heat-row" },
        el("div", { text: `${label}: min ${fmt(lo)} · median ${fmt(mid)} · max ${fmt(hi)} · highest: rank ${worst.join(", rank ")}` }), svg);
    });
  }
};
