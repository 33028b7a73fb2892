// torchscope dashboard, Modules view: time per nn.Module path (forward calls, means per step) and where the
// top operators are called from in the user's code. It only presents R.modules and R.call_sites
// (analysis/modules.py, analysis/callsites.py); dashboard.js calls it with its helpers, and every string from
// the data goes in through textContent (h.el), never innerHTML.
"use strict";
window.tsModulesView = function (root, R, h) {
  const { el, card, table, fmtUs } = h;
  const modules = R.modules || [];
  const sites = R.call_sites || [];
  const device = R.device && R.device.present;
  if (!modules.length) {
    root.append(card("Modules", el("p", { class: "muted", text: "No nn.Module calls in this trace (capture with Python stacks: with_stack=True, torchscope's default)." })));
  } else {
    const columns = [
      { key: "path", title: "module path" },
      { key: "calls_per_step", title: "calls/step", num: true, fmt: (v) => Number(v).toLocaleString(undefined, { maximumSignificantDigits: 4 }) },
      { key: "host_us_per_step", title: "host/step", num: true, fmt: fmtUs },
      { key: "host_self_us_per_step", title: "host self/step", num: true, fmt: fmtUs },
    ];
    if (device) columns.push({ key: "device_us_per_step", title: "device/step", num: true, fmt: fmtUs });
    const body = table(columns, modules, { sort: "host_us_per_step" });
    body.classList.add("ts-modules");
    root.append(card("Modules, forward (mean per step; paths are the profiler's <Class>_<n> names)", body));
  }
  if (sites.length) {
    const columns = [
      { key: "operator", title: "operator" },
      { key: "site", title: "called from" },
      { key: "calls", title: "calls", num: true, fmt: (v) => Number(v).toLocaleString() },
      { key: "host_self_us", title: "host self", num: true, fmt: fmtUs },
    ];
    if (device) columns.push({ key: "device_self_us", title: "device self", num: true, fmt: fmtUs });
    const body = table(columns, sites, { sort: "host_self_us" });
    body.classList.add("ts-call-sites");
    root.append(card("Call sites of the top operators (totals over the whole trace)", body));
  }
};
