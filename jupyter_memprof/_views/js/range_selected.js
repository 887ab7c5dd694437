// SelectionGeometry on a timeline (box select along time): filter ops and blocks by time.
// `estimate`: the x axis counts records of a fake run (an estimate's clock), not milliseconds.
/* global cb_obj, allocs, ops, alloc_filter, op_filter, filter_info, estimate */

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
const span = estimate
  ? `records #${Math.max(0, Math.round(t0))} &ndash; #${Math.max(0, Math.round(t1))} of the run`
  : `${t0.toFixed(3)} &ndash; ${t1.toFixed(3)} ms`;
filter_info.text = `<b>${estimate ? "Position filter" : "Time filter"}</b> ${span}: ` +
  `${ka} of ${na} listed blocks alive, ${ko} of ${ob.length} shown ops running.`;
