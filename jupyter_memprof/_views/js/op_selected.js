// ops.selected changed (tap in the op tree, or a row of the op table): highlight the op's
// forward/backward partners, its flows and the blocks allocated inside it; describe it.
/* global ops, flows, allocs, lin_view, op_info, lin_info, op_hint, lin_hint */
/* global esc, set_sel, echo, empty_of */

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
