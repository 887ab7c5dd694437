// Puts BokehJS (with its widgets and tables) into a notebook page, unless this version is
// already there. The kernel appends the call, with Bokeh's version and the sources of its
// bundles; each source runs as a function with `this` bound to window, as BokehJS expects.
/* exported memprof_load_bokehjs */

function memprof_load_bokehjs(version, sources) {
  const B = window.Bokeh;
  if (B && B.version === version && B.Widgets && B.Tables) return;
  for (const source of sources) new Function(source).call(window);
}
