/*
 * multicdn rum.js: real-user measurements for a site served by several CDNs.
 *
 * On the page (any origin the service allows), one line, anywhere:
 *
 *   <script async src="https://rum.example.com/rum/rum.js"></script>
 *
 * The service fills in CONFIG below when it serves this file: the two beacon URLs, the probe URL
 * of every provider, the probe sample rate and the verdict's lifetime and storage key.
 *
 * What it does:
 * 1. Navigation beacon, on every page load: after `load`, the page's own TTFB and the CDN that
 *    served it, read from the Server-Timing entries every edge adds
 *    (`Server-Timing: cdn;desc="fastly", pop;desc="LHR", cache;desc="HIT"`), go to CONFIG.nav as
 *    {"id","path","ttfb","provider","pop","cache"}.
 * 2. Probe, on CONFIG.sample of page loads, at idle: every provider's probe object is fetched once
 *    (no cache, a random query), timed from its Resource Timing entry when the edge sends
 *    Timing-Allow-Origin (responseStart - startTime), else with performance.now() around the
 *    fetch. A failed fetch is null. {"id","times","best"} goes to CONFIG.cdn.
 * 3. Verdict: the probe's winner is kept in localStorage (CONFIG.verdict_key) as
 *    {provider, at, ttl_ms, weight}. One probe is a noisy, weak signal, so it is blended in, see
 *    blend(). Pages may read it to pick asset hostnames: window.multicdn.verdict().
 *
 * window.multicdn = {verdict(), probe()}: probe() runs one probe now (sampled or not) and
 * resolves to what it sent. Beacons go with navigator.sendBeacon (text/plain), else
 * fetch(..., {keepalive: true}). Nothing here throws into the page.
 */
(function () {
  'use strict';
  const CONFIG = __MULTICDN_CONFIG__;

  // A probe counts this much; a verdict's weight decays linearly to 0 over its ttl_ms.
  const PROBE_WEIGHT = 0.5;

  function randomId() {
    const bytes = new Uint8Array(8);
    if (window.crypto && crypto.getRandomValues) {
      crypto.getRandomValues(bytes);
    } else {
      for (let i = 0; i < bytes.length; i++) bytes[i] = Math.floor(Math.random() * 256);
    }
    return Array.from(bytes, (b) => b.toString(16).padStart(2, '0')).join('');
  }

  function send(url, body) {
    const json = JSON.stringify(body);
    try {
      if (navigator.sendBeacon && navigator.sendBeacon(url, json)) return;
    } catch (e) {
      // sendBeacon refused (too large, or blocked): try fetch.
    }
    try {
      fetch(url, {
        method: 'POST', body: json, keepalive: true, credentials: 'omit',
        headers: { 'content-type': 'text/plain' },
      }).catch(() => {});
    } catch (e) {
      // No way to send: the measurement is lost, the page is not disturbed.
    }
  }

  // --- the verdict -------------------------------------------------------------------------------

  function readStored(now) {
    let v;
    try {
      v = JSON.parse(localStorage.getItem(CONFIG.verdict_key) || 'null');
    } catch (e) {
      return null; // storage disabled, or not JSON
    }
    if (!v || typeof v.provider !== 'string' || !(v.ttl_ms > 0) || typeof v.at !== 'number') {
      return null;
    }
    const age = now - v.at;
    if (age < 0 || age >= v.ttl_ms) return null; // expired (or from a clock that went back)
    const weight = Math.max(0, Math.min(1, Number(v.weight) || 0)) * (1 - age / v.ttl_ms);
    return { provider: v.provider, at: v.at, ttl_ms: v.ttl_ms, weight: weight };
  }

  // Blending a new probe winner into the old verdict (whose weight has already decayed):
  // - no (or an expired) verdict: the winner, with PROBE_WEIGHT;
  // - the same provider wins again: weight + PROBE_WEIGHT * (1 - weight), so agreement builds
  //   towards 1 but never reaches it;
  // - another provider wins: the probe's PROBE_WEIGHT is subtracted from the old weight; if the old
  //   verdict is left with weight, it holds (weakened), else the winner takes over with what is left
  //   of the probe's weight.
  // The result is stored with at = now, so decay restarts from the blended weight.
  function blend(old, winner) {
    if (!old) return { provider: winner, weight: PROBE_WEIGHT };
    if (old.provider === winner) {
      return { provider: winner, weight: old.weight + PROBE_WEIGHT * (1 - old.weight) };
    }
    if (old.weight > PROBE_WEIGHT) return { provider: old.provider, weight: old.weight - PROBE_WEIGHT };
    return { provider: winner, weight: PROBE_WEIGHT - old.weight };
  }

  function remember(winner) {
    const now = Date.now();
    const next = blend(readStored(now), winner);
    const v = { provider: next.provider, at: now, ttl_ms: CONFIG.verdict_ttl_ms, weight: next.weight };
    try {
      localStorage.setItem(CONFIG.verdict_key, JSON.stringify(v));
    } catch (e) {
      // storage full or disabled: no verdict, beacons still go
    }
  }

  // --- the probe ---------------------------------------------------------------------------------

  // The time of one fetch of `href`: Resource Timing when the edge sends Timing-Allow-Origin
  // (responseStart - startTime), else performance.now() around the fetch.
  function elapsed(href, started, ended) {
    const entry = performance.getEntriesByName(href, 'resource').pop();
    const ms = entry && entry.responseStart > 0 ? entry.responseStart - entry.startTime : ended - started;
    return Math.max(0.1, Math.round(ms * 10) / 10); // a fetch that answered took some time
  }

  async function timeOne(base) {
    const url = new URL(base, location.href);
    url.searchParams.set('r', randomId());
    let started = performance.now();
    try {
      // CORS, so that an edge answering 503 counts as failed, not as fast.
      const res = await fetch(url.href, { cache: 'no-store', mode: 'cors', credentials: 'omit' });
      await res.arrayBuffer(); // the whole object, so its timing entry is complete
      const ended = performance.now();
      return res.ok ? elapsed(url.href, started, ended) : null;
    } catch (e) {
      // A network error, or an edge that sends no Access-Control-Allow-Origin for the probe
      // object. Ask once more without CORS: a failure now is the network's; an answer is timed
      // (its status cannot be read: configure the header to have failures counted).
      url.searchParams.set('r', randomId());
      started = performance.now();
      try {
        await fetch(url.href, { cache: 'no-store', mode: 'no-cors', credentials: 'omit' });
        return elapsed(url.href, started, performance.now());
      } catch (e2) {
        return null;
      }
    }
  }

  async function probe() {
    const names = Object.keys(CONFIG.probes || {});
    const measured = await Promise.all(names.map((n) => timeOne(CONFIG.probes[n])));
    const times = {};
    let best = null;
    names.forEach((n, i) => {
      times[n] = measured[i];
      if (measured[i] !== null && (best === null || measured[i] < times[best])) best = n;
    });
    const body = { id: randomId(), times: times, best: best };
    if (best !== null) remember(best);
    send(CONFIG.cdn, body);
    return body;
  }

  // --- the navigation beacon ---------------------------------------------------------------------

  function navigation() {
    const nav = performance.getEntriesByType && performance.getEntriesByType('navigation')[0];
    if (!nav) return;
    const st = {};
    (nav.serverTiming || []).forEach((t) => {
      st[t.name] = t.description; // the edge adds its entries after the origin's: last wins
    });
    send(CONFIG.nav, {
      id: randomId(),
      path: location.pathname,
      ttfb: Math.round(nav.responseStart),
      provider: st.cdn || 'unknown',
      pop: st.pop || '',
      cache: st.cache || '',
    });
  }

  // --- wiring ------------------------------------------------------------------------------------

  window.multicdn = {
    verdict: () => readStored(Date.now()),
    probe: probe,
  };

  if (!window.fetch || !window.performance) return; // too old to measure; the page is unaffected

  // After load, and a turn later, so responseStart and the Server-Timing entries are final.
  if (document.readyState === 'complete') {
    setTimeout(navigation, 0);
  } else {
    addEventListener('load', () => setTimeout(navigation, 0), { once: true });
  }

  if (Math.random() < CONFIG.sample) {
    const run = () => { probe().catch(() => {}); };
    if ('requestIdleCallback' in window) requestIdleCallback(run, { timeout: 5000 });
    else setTimeout(run, 3000);
  }
})();
