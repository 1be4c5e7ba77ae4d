// multicdn: CMSD quality caps for hls.js.
//
// hls.js does not read CMSD response headers itself. When an edge sheds load it adds
//   CMSD-Dynamic: "edge-sin-1";mb=2500;du
// to segment responses (multicdn's QualityGovernor; `mb` is the maximum suggested bitrate in
// kbps, the rung's total bitrate, audio included). This function reads that header on every
// fragment hls.js loads and sets `hls.autoLevelCapping` to the highest level whose bitrate fits
// under `mb` (the lowest level when none does), and back to -1 (no cap) when `mb` is at or
// above the top level: the edge lifts a cap by sending the top rung's `mb`; a response without
// the header leaves the cap as it is. When several hops appended entries the smallest `mb`
// counts. The cap is worked out again when the level list changes (a content-steering pathway
// switch). It caps ABR only: a level the viewer picks by hand is left alone.
//
// Cross-origin segments: the edge must send `Access-Control-Expose-Headers: CMSD-Dynamic`,
// or the browser hides the header from the page.
//
// Use (copy this file beside hls.js):
//   const hls = new Hls();
//   const cmsd = multicdnCmsdHls(hls, Hls);   // cmsd.mbKbps(): the last mb read, or null
//   hls.loadSource(url); hls.attachMedia(video);
//   cmsd.detach();                           // stop following the header
//
// No dependencies, no globals besides the function itself.

/**
 * The smallest `mb` (kbps) in a CMSD-Dynamic value, or null when it has none.
 * @param {string | null} value
 * @returns {number | null}
 */
function multicdnCmsdMaxBitrateKbps(value) {
  if (!value) return null;
  // Blank out quoted node names first, so a name cannot look like a parameter.
  const unquoted = value.replace(/"(?:[^"\\]|\\.)*"/g, '""');
  let min = null;
  for (const m of unquoted.matchAll(/;\s*mb=(\d+(?:\.\d+)?)/g)) {
    const kbps = Number(m[1]);
    if (Number.isFinite(kbps) && kbps > 0 && (min === null || kbps < min)) min = kbps;
  }
  return min;
}

/**
 * Follows CMSD-Dynamic `mb` on the fragments `hls` loads by capping its ABR.
 * @param {object} hls an hls.js instance
 * @param {object} Hls the hls.js class (for its event names)
 * @returns {{ mbKbps: () => number | null, detach: () => void }}
 */
function multicdnCmsdHls(hls, Hls) {
  let mbKbps = null;

  function header(details) {
    if (!details) return null;
    if (typeof details.getResponseHeader === 'function') return details.getResponseHeader('CMSD-Dynamic');
    if (details.headers && typeof details.headers.get === 'function') return details.headers.get('CMSD-Dynamic');
    return null;
  }

  function apply() {
    const levels = hls.levels || [];
    if (mbKbps === null || levels.length === 0) return;
    const max = mbKbps * 1000;
    const top = levels.reduce((m, l) => Math.max(m, l.bitrate), 0);
    let cap = -1;
    if (max < top) {
      cap = 0;
      levels.forEach((l, i) => {
        if (l.bitrate <= max && l.bitrate >= levels[cap].bitrate) cap = i;
      });
    }
    if (hls.autoLevelCapping !== cap) hls.autoLevelCapping = cap;
  }

  function onFragLoaded(_event, data) {
    const mb = multicdnCmsdMaxBitrateKbps(header(data && data.networkDetails));
    if (mb === null) return;
    mbKbps = mb;
    apply();
  }

  hls.on(Hls.Events.FRAG_LOADED, onFragLoaded);
  hls.on(Hls.Events.LEVELS_UPDATED, apply);
  hls.on(Hls.Events.MANIFEST_PARSED, apply);
  return {
    mbKbps: () => mbKbps,
    detach() {
      hls.off(Hls.Events.FRAG_LOADED, onFragLoaded);
      hls.off(Hls.Events.LEVELS_UPDATED, apply);
      hls.off(Hls.Events.MANIFEST_PARSED, apply);
    },
  };
}
