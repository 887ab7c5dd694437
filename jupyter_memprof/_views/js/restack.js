// A category's legend entry was clicked: re-stack the visible categories.
/* global src, cats, renderers */

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
