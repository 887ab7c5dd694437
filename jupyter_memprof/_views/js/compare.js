// The comparison view's linking, run by Bokeh's CustomJS (the body of one function).
//
// Arguments (see jupyter_memprof/_views/compare.py):
//   mode      "by": the grouping changed; "select": a row of the diff table was clicked
//   rows      the diff table's data source (columns key, a, b, delta, ratio, delta_bytes)
//   by        the Select choosing the grouping (category, module, op)
//   tables    grouping -> the table's columns for that grouping
//   series    grouping -> key -> {a: {t, y}, b: {t, y}}: live bytes of that key over time
//   hl_a/hl_b the data sources of the highlight lines in the two timelines
//   areas_a/b category -> the stacked area renderer of that category
//   status    a Div that says what is highlighted (set as text, never as HTML)
/* global mode, rows, by, tables, series, hl_a, hl_b, areas_a, areas_b, status */

const FADED = 0.15;
const SHOWN = 0.85;

function setAreas(areas, category) {
  for (const [name, renderer] of Object.entries(areas)) {
    const alpha = category === null || name === category ? SHOWN : FADED;
    renderer.glyph.fill_alpha = alpha;
  }
}

function clearHighlight() {
  hl_a.data = {t: [], y: []};
  hl_b.data = {t: [], y: []};
  setAreas(areas_a, null);
  setAreas(areas_b, null);
}

function say(text) {
  // Div.text is HTML: escape what we put there
  const escaped = text.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
  status.text = escaped;
}

if (mode === "by") {
  const columns = tables[by.value];
  rows.selected.indices = [];
  rows.data = Object.assign({}, columns);
  clearHighlight();
  say("Click a row to highlight it in both timelines.");
} else {
  const picked = rows.selected.indices;
  if (picked.length !== 1) {
    clearHighlight();
    say("Click a row to highlight it in both timelines.");
  } else {
    const i = picked[0];
    const key = rows.data.key[i];
    const group = by.value;
    const s = (series[group] || {})[key];
    if (s) {
      hl_a.data = {t: s.a.t.slice(), y: s.a.y.slice()};
      hl_b.data = {t: s.b.t.slice(), y: s.b.y.slice()};
    } else {
      hl_a.data = {t: [], y: []};
      hl_b.data = {t: [], y: []};
    }
    const category = group === "category" ? key : null;
    setAreas(areas_a, category);
    setAreas(areas_b, category);
    const line = s ? "the black line traces its live bytes" : "no time series kept for it";
    say(`${group} ${key}: ${rows.data.a[i]} -> ${rows.data.b[i]} (${rows.data.delta[i]}); ${line}`);
    window.memprofCompareSelected = {group: group, key: key};
  }
}
