// Puts BokehJS (with its widgets and tables) into a notebook page, unless this version is
// already there. The kernel appends the call, with Bokeh's version and the sources of its
// bundles; each source runs as a function with `this` bound to window, as BokehJS expects.
/* exported memprof_load_bokehjs */

function memprof_load_bokehjs(version, sources) {
  const B = window.Bokeh;
  if (B && B.version === version && B.Widgets && B.Tables) return;
  for (const source of sources) new Function(source).call(window);
}

// In a notebook, as in the standalone page: window.memprofReady is set to performance.now()
// once a dashboard's view is on the page and painted (watched from each display, for two
// minutes at most).
/* exported memprof_watch_ready */
function memprof_watch_ready() {
  const t0 = performance.now();
  const shown = () => {
    const B = window.Bokeh;
    for (const doc of (B && B.documents) || []) {
      for (const root of doc.roots()) {
        if (root.name !== "memprof-dashboard") continue;
        const view = B.index[root.id];
        if (view && view.el && view.el.isConnected) return true;
      }
    }
    return false;
  };
  const tick = () => {
    if (shown()) {
      requestAnimationFrame(() => { window.memprofReady = performance.now(); });
    } else if (performance.now() - t0 < 120000) {
      setTimeout(tick, 100);
    }
  };
  tick();
}
