// Shared by the selection callbacks: an HTML escaper, and a per-dashboard record of the
// selections the callbacks set themselves. BokehJS runs CustomJS callbacks asynchronously,
// so a selection set here comes back later as a change event; `echo` recognises it (and
// lets it go) so that only what the user clicked drives the views.
/* global uid */
/* exported esc, set_sel, echo, empty_of */

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
