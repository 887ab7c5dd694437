"""The dashboard's browser-side behaviour (Bokeh CustomJS bodies).

Everything linked runs here, in the page, so the notebook widget and the exported HTML file
behave the same without a kernel. Every user-controlled string (op names, module paths,
callsites, record_function labels, tensor names) that goes into a Div's HTML passes through
``esc`` first.
"""

from __future__ import annotations

# Shared by every callback: an HTML escaper, and a per-dashboard record of the selections the
# callbacks set themselves. BokehJS runs CustomJS callbacks asynchronously, so a selection set
# here comes back later as a change event; `echo` recognises it (and lets it go) so that only
# what the user clicked drives the views.
PRELUDE = """
const esc = (s) => String(s).replace(/[&<>"']/g, (c) => ({
  "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"})[c]);
const root = (window.__memprof = window.__memprof || {});
const st = (root[uid] = root[uid] || {expect: {}});
const key = (idx) => Array.from(idx).sort((x, y) => x - y).join(",");
const set_sel = (name, src, idx) => {
  const k = key(idx);
  if (k === key(src.selected.indices)) return;
  st.expect[name] = k;
  src.selected.indices = idx;
};
const echo = (name, src) => {
  const mine = st.expect[name] !== undefined && st.expect[name] === key(src.selected.indices);
  delete st.expect[name];
  return mine;
};
const empty_of = (src) => {
  const out = {};
  for (const k of Object.keys(src.data)) out[k] = [];
  return out;
};
"""

BYTES_FORMAT = """
const u = ["B", "KiB", "MiB", "GiB", "TiB"];
let n = Math.abs(value), i = 0;
while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
return (value < 0 ? "-" : "") + (i ? n.toFixed(2) : n.toFixed(0)) + " " + u[i];
"""

BYTES_TICK = """
const u = ["B", "KiB", "MiB", "GiB", "TiB"];
let n = Math.abs(tick), i = 0;
while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
return (tick < 0 ? "-" : "") + String(Number(n.toFixed(2))) + " " + u[i];
"""

# ops.selected changed (tap in the op tree, or a row of the op table)
OP_SELECTED = (
    PRELUDE
    + """
if (echo("ops", ops)) return;
const sel = ops.selected.indices;
if (sel.length === 0) { op_info.text = op_hint; return; }
const d = ops.data, f = flows.data, a = allocs.data;
const i = sel[0];
const partners = [], frows = [];
for (let k = 0; k < f.fi.length; k++) {
  if (f.fi[k] === i) { partners.push(f.bi[k]); frows.push(k); }
  else if (f.bi[k] === i) { partners.push(f.fi[k]); frows.push(k); }
}
// blocks allocated inside this op: same thread, allocation time within the op
const l = d.left[i], r = d.right[i], th = d.thread[i];
const inside = [];
for (let k = 0; k < a.alloc_id.length; k++) {
  if (!a.summary[k] && a.thread[k] === th && a.t_alloc[k] >= l && a.t_alloc[k] <= r) inside.push(k);
}
set_sel("ops", ops, [i, ...partners.filter((p) => p !== i)]);
set_sel("flows", flows, frows);
set_sel("allocs", allocs, inside);
lin_view.data = empty_of(lin_view);
let html = `<b>${esc(d.name[i])}</b> (${esc(d.kind[i])}, ${esc(d.phase[i])}, ` +
  `${esc(d.start_txt[i])} + ${esc(d.dur_txt[i])})`;
if (d.module[i]) html += ` in <code>${esc(d.module[i])}</code>`;
if (d.callsite[i]) html += ` at <code>${esc(d.callsite[i])}</code>`;
html += `<br>allocated ${esc(d.total_txt[i])} (itself: ${esc(d.self_txt[i])}); ` +
  `${inside.length} listed block(s) highlighted`;
if (partners.length) {
  const label = f.bi.includes(i) && !f.fi.includes(i) ? "forward partner" : "backward partner";
  html += `<br>${label}: ` +
    partners.map((p) => `<span class="memprof-partner"><b>${esc(d.name[p])}</b></span>`).join(", ");
}
op_info.text = html;
lin_info.text = inside.length
  ? `${inside.length} block(s) allocated inside <b>${esc(d.name[i])}</b> are highlighted: ` +
    `click one for its lineage.`
  : lin_hint;
"""
)

# allocs.selected changed (a row of the allocations table, or a lifetime bar)
ALLOC_SELECTED = (
    PRELUDE
    + """
if (echo("allocs", allocs)) return;
const sel = allocs.selected.indices;
const a = allocs.data;
if (sel.length !== 1) {
  lin_view.data = empty_of(lin_view);
  lin_info.text = sel.length
    ? `${sel.length} blocks selected: click one block for its lineage.` : lin_hint;
  return;
}
const i = sel[0];
if (a.summary[i]) {
  lin_view.data = empty_of(lin_view);
  lin_info.text = `<b>${esc(a.name[i])}</b>: ${esc(a.size_txt[i])} of ` +
    `${esc(a.category[i])} on ${esc(a.device[i])}, in blocks too small to list one by one ` +
    `(<code>prof.allocations</code> has every block).`;
  return;
}
// the block's rows of the flat, encoded lineage table, back to text
const L = lin_all.data;
const s = a.lin0[i], e = a.lin1[i];
const text = (c) => (c >= 0 ? pool[c] : "");
const ms = (v) => !Number.isFinite(v) ? "before capture"
  : Math.abs(v) >= 1000 ? (v / 1000).toFixed(3) + " s"
  : Math.abs(v) >= 1 ? v.toFixed(3) + " ms" : (v * 1000).toFixed(1) + " µs";
const data = {t_txt: [], version: []};
const strings = ["op_name", "relation", "category", "phase", "module", "callsite"];
for (const k of strings) data[k] = [];
for (let k = s; k < e; k++) {
  data.t_txt.push(ms(L.t[k]));
  data.version.push(L.version[k] >= 0 ? String(L.version[k]) : "");
  for (const c of strings) data[c].push(text(L[c][k]));
}
lin_view.data = data;
const hl = new Set();
let creator = null;
const back = [];
for (let k = s; k < e; k++) {
  if (!L.hl[k]) continue;
  hl.add(L.op_row[k]);
  const name = text(L.op_name[k]), rel = text(L.relation[k]), phase = text(L.phase[k]);
  if (rel === "allocated" && creator === null) creator = name;
  else if (phase === "backward" && !back.includes(name)) back.push(name);
}
set_sel("ops", ops, [...hl]);
set_sel("flows", flows, []);
let html = `<b>${esc(a.name[i])}</b>: ${esc(a.size_txt[i])}, ${esc(a.category[i])} on ` +
  `${esc(a.device[i])}, lifetime ${esc(a.lifetime[i])}`;
if (creator !== null) {
  html += `<br>created by <span class="memprof-creator"><b>${esc(creator)}</b></span>`;
  if (a.module[i]) html += ` in <code>${esc(a.module[i])}</code>`;
} else if (e === s) {
  html += `<br>no op touched this block during the capture`;
}
if (back.length) html += `<br>backward: ${back.map((b) => `<b>${esc(b)}</b>`).join(", ")}`;
if (a.reason[i]) html += `<br>category rule: ${esc(a.reason[i])}`;
lin_info.text = html;
op_info.text = hl.size
  ? `${hl.size} op(s) of the lineage of <b>${esc(a.name[i])}</b> are highlighted in the op tree.`
  : op_hint;
"""
)

# SelectionGeometry on a timeline (box select along time): filter ops and blocks by time
RANGE_SELECTED = (
    PRELUDE
    + """
const g = cb_obj.geometry;
if (g.type !== "rect") return;
const t0 = Math.min(g.x0, g.x1), t1 = Math.max(g.x0, g.x1);
const a = allocs.data, d = ops.data;
const ab = new Array(a.x0.length);
let ka = 0, na = 0;
for (let k = 0; k < ab.length; k++) {
  if (a.summary[k]) { ab[k] = false; continue; }
  na++;
  ab[k] = a.x0[k] <= t1 && a.x1[k] >= t0;
  if (ab[k]) ka++;
}
const ob = new Array(d.left.length);
let ko = 0;
for (let k = 0; k < ob.length; k++) {
  ob[k] = d.left[k] <= t1 && d.right[k] >= t0;
  if (ob[k]) ko++;
}
alloc_filter.booleans = ab;
op_filter.booleans = ob;
filter_info.text = `<b>Time filter</b> ${t0.toFixed(3)} &ndash; ${t1.toFixed(3)} ms: ` +
  `${ka} of ${na} listed blocks alive, ${ko} of ${ob.length} shown ops running.`;
"""
)

RANGE_CLEARED = """
alloc_filter.booleans = null;
op_filter.booleans = null;
filter_info.text = filter_hint;
"""

# a category's legend entry was clicked: re-stack the visible categories
RESTACK = """
const d = src.data;
const n = d.t.length;
const acc = new Float64Array(n);
const out = Object.assign({}, d);
for (let j = 0; j < cats.length; j++) {
  const c = cats[j];
  out["lo_" + c] = Float64Array.from(acc);
  if (renderers[j].visible) {
    const b = d["b_" + c];
    for (let k = 0; k < n; k++) acc[k] += b[k];
  }
  out["hi_" + c] = Float64Array.from(acc);
}
src.data = out;
"""
