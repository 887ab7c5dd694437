// allocs.selected changed (a row of the allocations table, or a lifetime bar): show the
// block's lineage (decoded from the flat lineage table) and highlight its ops.
// `estimate`: times are positions in a fake run (records), not milliseconds.
/* global allocs, ops, flows, lin_all, lin_view, pool, op_info, lin_info, op_hint, lin_hint */
/* global estimate, esc, set_sel, echo, empty_of, format_ms, format_records */

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
const data = {t_txt: [], version: []};
const strings = ["op_name", "relation", "category", "phase", "module", "callsite"];
for (const k of strings) data[k] = [];
for (let k = s; k < e; k++) {
  const when = estimate ? format_records(L.t[k]) : format_ms(L.t[k]);
  data.t_txt.push(Number.isFinite(L.t[k]) ? when : "before capture");
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
