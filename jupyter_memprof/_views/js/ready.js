// A plot of the dashboard was laid out (its inner width became known): after the next paint,
// window.memprofReady is set to performance.now(), in a notebook as in the standalone page
// (where the page's loader also sets it).
/* global cb_obj */

if (window.memprofReady === undefined && cb_obj.inner_width > 0) {
  requestAnimationFrame(() => {
    if (window.memprofReady === undefined) window.memprofReady = performance.now();
  });
}
