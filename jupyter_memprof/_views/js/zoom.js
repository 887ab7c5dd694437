// The time range changed: redraw one device's chart per pixel column, from the zoom levels
// sent with the page (see _views/dashboard/levels.py). Level L keeps the first, last, lowest
// and highest state of each of columns * 2**L equal slices of the capture; the level drawn
// is the coarsest whose columns are at most one pixel wide. Zoomed in beyond the finest
// level sent, the finest is drawn and the window is written to `request`, which a notebook's
// kernel (holding every state) answers by setting the chart's data itself.
/* global src, levels, request, plot, cats, renderers, op_pool, module_pool, columns, finest,
   span, x_range */

// A zoom changes the range's start and end one after the other: the two changes are drawn
// once, when both are in.
const pending = (window.__memprofZoomPending = window.__memprofZoomPending || new Set());
if (pending.has(src.id)) return;
pending.add(src.id);
window.setTimeout(() => {
  pending.delete(src.id);
  redraw();
}, 0);

function redraw() {
  const lo = x_range.start, hi = x_range.end;
  const px = Math.max(100, plot.inner_width || plot.width || 1000);
  const need = (px * span) / Math.max(hi - lo, 1e-12) / columns;
  const want = Math.max(0, Math.ceil(Math.log2(Math.max(need, 1))));
  const level = Math.min(want, finest);
  const L = levels.data, t = L.t, lv = L.level, n = t.length;
  let a = 0, b = n;  // the first state after lo
  while (a < b) {
    const m = (a + b) >> 1;
    if (t[m] <= lo) a = m + 1; else b = m;
  }
  let i0 = Math.max(0, a - 1);  // the state in force at lo, of this level
  while (i0 > 0 && lv[i0] > level) i0--;
  const rows = [];
  for (let i = i0; i < n; i++) {
    if (lv[i] > level) continue;
    rows.push(i);
    if (t[i] > hi) break;
  }
  const opens = rows.length === 0 || (i0 === 0 && t[rows[0]] > 0);  // nothing live before
  const closes = rows.length > 0 && t[rows[rows.length - 1]] < span;  // the last state held
  const m = rows.length + (opens ? 1 : 0) + (closes ? 1 : 0);
  const out = {t: new Float64Array(m), total: new Float64Array(m), op: new Array(m),
    module: new Array(m)};
  for (const c of cats) out["b_" + c] = new Float64Array(m);
  let k = 0;
  const put = (i, x) => {
    out.t[k] = x;
    out.total[k] = i < 0 ? 0 : L.total[i];
    for (const c of cats) out["b_" + c][k] = i < 0 ? 0 : L["b_" + c][i];
    const op = i < 0 ? -1 : L.op[i], mod = i < 0 ? -1 : L.module[i];
    out.op[k] = op >= 0 ? op_pool[op] : "";
    out.module[k] = mod >= 0 ? module_pool[mod] : "";
    k++;
  };
  if (opens) put(-1, 0);
  for (const i of rows) put(i, t[i]);
  if (closes) {
    put(rows[rows.length - 1], span);
    out.op[k - 1] = out.module[k - 1] = "";
  }
  const acc = new Float64Array(m);
  for (let j = 0; j < cats.length; j++) {
    const c = cats[j];
    out["lo_" + c] = Float64Array.from(acc);
    if (renderers[j].visible) {
      const bc = out["b_" + c];
      for (let q = 0; q < m; q++) acc[q] += bc[q];
    }
    out["hi_" + c] = Float64Array.from(acc);
  }
  src.data = out;
  window.memprofZoom = {level, want, points: m, lo, hi};
  if (want > finest) request.data = {lo: [lo], hi: [hi], px: [px], level: [want]};
}
