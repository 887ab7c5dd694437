// The standalone HTML file's loader: inflate BokehJS and the document (gzip + base64 in
// <script type="application/octet-stream"> elements), run BokehJS, embed the document.
// When the dashboard is on screen, window.memprofReady is set to performance.now().

(async function () {
  const status = document.getElementById("memprof-status");
  try {
    if (typeof DecompressionStream === "undefined") {
      throw new Error("this browser has no DecompressionStream " +
        "(it needs Chrome 80, Firefox 113, Safari 16.4 or newer)");
    }
    const inflate = async (id) => {
      const b64 = document.getElementById(id).textContent.trim();
      const bin = atob(b64);
      const bytes = new Uint8Array(bin.length);
      for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
      const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
      return await new Response(stream).text();
    };
    const [js, doc] = await Promise.all([inflate("memprof-bokehjs"), inflate("memprof-doc")]);
    performance.mark("memprof-inflated");
    const script = document.createElement("script");
    script.textContent = js;
    document.head.appendChild(script);
    performance.mark("memprof-bokehjs");
    const render_items = JSON.parse(document.getElementById("memprof-render-items").textContent);
    await window.Bokeh.embed.embed_items(JSON.parse(doc), render_items);
    performance.mark("memprof-embedded");
    status.remove();
    requestAnimationFrame(() => { window.memprofReady = performance.now(); });
  } catch (err) {
    status.textContent = "The dashboard could not be shown: " + err.message;
    window.memprofError = String(err);
    throw err;
  }
})();
