// Puts BokehJS (with its widgets and tables) into a notebook page, unless this version is
// already there. The kernel appends the call, with Bokeh's version and the sources of its
// bundles; each source runs as a function with `this` bound to window, as BokehJS expects.
// The page keeps this script in its local storage (about 2 MB): the JupyterLab extension
// runs it when the page is loaded again, before the widget manager makes the views of the
// dashboards it restores, which cannot be made without BokehJS.
/* exported memprof_load_bokehjs */

function memprof_load_bokehjs(version, sources) {
  const B = window.Bokeh;
  if (!(B && B.version === version && B.Widgets && B.Tables)) {
    for (const source of sources) new Function(source).call(window);
  }
  try {
    const store = window.localStorage;
    if (store.getItem("jupyter-memprof:bokehjs-version") !== version) {
      const call = `(${memprof_load_bokehjs})(${JSON.stringify(version)}, ${JSON.stringify(sources)});`;
      store.setItem("jupyter-memprof:bokehjs", call);
      store.setItem("jupyter-memprof:bokehjs-version", version);
    }
  } catch {
    // storage full or disabled: a reloaded page's dashboards are drawn once the kernel sends it
  }
}
