#!/usr/bin/env node
// Drives the system Chromium through one job, for multicdn's browser test (tests/browser.rs).
//
//   node drive.mjs '{"steps":[{"goto":"http://127.0.0.1:8080/"},{"eval":"window.multicdn.probe()"}]}'
//   echo '{"steps":[...]}' | node drive.mjs
//
// A job is {"steps": [...], "timeout_ms": 60000, "strict": true, "viewport": {"width", "height"}}.
// Steps run in order, one key names each:
//   {"goto": url}                       load the page (waits for `load`); a 4xx/5xx fails
//   {"eval": "js expression"}           evaluate in the page; a promise is awaited; its value is kept
//   {"wait_for": "css selector"}        until an element matches (`timeout_ms` per step, 15 s default)
//   {"wait_fn": "js expression"}        until the expression is truthy; with "soft": true a
//                                       timeout is recorded ("timed_out": true) and the job goes on
//   {"dom": "css selector"}             read every matching element: tag, text, attributes (none fails)
//   {"fill": "css selector", "value": "text"}   type into a form field
//   {"click": "css selector"}           click
//   {"screenshot": "path.png"}          the full page, directories made as needed
//   {"sleep_ms": 200}                   wait (prefer wait_for / wait_fn)
//
// Prints one JSON object on stdout: {"ok", "error", "steps": [{step, ...result}], "console_errors",
// "page_errors", "failed_requests", "http_errors"}. Exits 0 when every step passed and (strict, the
// default) the page logged no console error, threw nothing and no request failed; 1 when a step or
// the strict check failed; 2 when the job is malformed or the browser cannot start; 3 on the overall
// timeout. The reason is also written to stderr. A failed request carries "left": true when it was
// cancelled while the job itself was leaving the page (a `goto`, or the end of the job).
//
// Chromium: $CHROMIUM, else /usr/bin/chromium; a fresh profile every run, removed afterwards.

import { chromium } from 'playwright-core';
import { mkdtempSync, mkdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';

const ARGS = [
  '--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
  '--disable-background-networking', '--disable-component-update', '--disable-sync',
];
const STEP_KINDS = ['goto', 'eval', 'wait_for', 'wait_fn', 'dom', 'fill', 'click', 'screenshot', 'sleep_ms'];

const result = {
  ok: false, error: null, steps: [],
  console_errors: [], page_errors: [], failed_requests: [], http_errors: [],
};
let context = null;
let profile = null;
// True while the job itself takes the page away (a `goto`, closing at the end): a request the
// page still had in flight then fails with net::ERR_ABORTED, as it would for a user who leaves.
let leaving = false;

function finish(code, error) {
  result.ok = code === 0;
  result.error = error;
  if (error) process.stderr.write(`drive.mjs: ${error}\n`);
  if (profile) rmSync(profile, { recursive: true, force: true });
  // Exit only once the result is written: a large result in a pipe is otherwise cut short.
  process.stdout.write(JSON.stringify(result, null, 2) + '\n', () => process.exit(code));
}

function readJob() {
  const text = process.argv[2] && process.argv[2] !== '-' ? process.argv[2] : readFileSync(0, 'utf8');
  let job;
  try {
    job = JSON.parse(text);
  } catch (e) {
    throw new Error(`the job is not JSON: ${e.message}`);
  }
  if (!job || !Array.isArray(job.steps) || job.steps.length === 0) {
    throw new Error('the job needs "steps": a non-empty array');
  }
  job.steps.forEach((s, i) => {
    const kinds = Object.keys(s || {}).filter((k) => STEP_KINDS.includes(k));
    if (kinds.length !== 1) {
      throw new Error(`step ${i} must have exactly one of ${STEP_KINDS.join(', ')}: ${JSON.stringify(s)}`);
    }
  });
  return job;
}

async function runStep(page, s) {
  const timeout = s.timeout_ms ?? 15000;
  if ('goto' in s) {
    leaving = true;
    let res;
    try {
      res = await page.goto(s.goto, { waitUntil: 'load', timeout });
    } finally {
      leaving = false;
    }
    const status = res ? res.status() : null;
    if (status !== null && status >= 400) throw new Error(`${s.goto} answered ${status}`);
    return { goto: s.goto, status };
  }
  if ('eval' in s) return { eval: s.eval, value: await page.evaluate(s.eval) };
  if ('wait_for' in s) {
    await page.waitForSelector(s.wait_for, { timeout });
    return { wait_for: s.wait_for };
  }
  if ('wait_fn' in s) {
    try {
      await page.waitForFunction(s.wait_fn, null, { timeout });
    } catch (e) {
      if (s.soft !== true || e?.name !== 'TimeoutError') throw e;
      return { wait_fn: s.wait_fn, timed_out: true };
    }
    return { wait_fn: s.wait_fn, timed_out: false };
  }
  if ('dom' in s) {
    const elements = await page.$$eval(s.dom, (els) => els.map((e) => ({
      tag: e.tagName.toLowerCase(),
      text: (e.innerText ?? e.textContent ?? '').trim(),
      attrs: Object.fromEntries(Array.from(e.attributes, (a) => [a.name, a.value])),
    })));
    if (elements.length === 0) throw new Error(`no element matches ${s.dom}`);
    return { dom: s.dom, elements };
  }
  if ('fill' in s) {
    await page.fill(s.fill, String(s.value ?? ''), { timeout });
    return { fill: s.fill };
  }
  if ('click' in s) {
    await page.click(s.click, { timeout });
    return { click: s.click };
  }
  if ('screenshot' in s) {
    mkdirSync(dirname(s.screenshot), { recursive: true });
    await page.screenshot({ path: s.screenshot, fullPage: true });
    return { screenshot: s.screenshot };
  }
  await page.waitForTimeout(Number(s.sleep_ms));
  return { sleep_ms: s.sleep_ms };
}

async function main() {
  let job;
  try {
    job = readJob();
  } catch (e) {
    return finish(2, e.message);
  }
  const overall = job.timeout_ms ?? 60000;
  setTimeout(() => finish(3, `the job did not finish within ${overall} ms`), overall).unref();

  const executablePath = process.env.CHROMIUM || '/usr/bin/chromium';
  profile = mkdtempSync(join(tmpdir(), 'multicdn-drive-'));
  try {
    context = await chromium.launchPersistentContext(profile, {
      executablePath, headless: true, args: ARGS,
      viewport: job.viewport ?? { width: 1280, height: 900 },
      timeout: 30000,
    });
  } catch (e) {
    return finish(2, `cannot start Chromium at ${executablePath}: ${e.message.split('\n')[0]}`);
  }
  const page = context.pages()[0] ?? (await context.newPage());
  page.on('console', (m) => {
    if (m.type() === 'error') result.console_errors.push({ text: m.text(), url: m.location().url });
  });
  page.on('pageerror', (e) => result.page_errors.push(String(e)));
  page.on('requestfailed', (r) => {
    result.failed_requests.push({
      url: r.url(), method: r.method(), type: r.resourceType(), failure: r.failure()?.errorText ?? '',
      left: leaving,
    });
  });
  page.on('response', (r) => {
    if (r.status() >= 400) result.http_errors.push({ url: r.url(), status: r.status() });
  });

  for (const [i, s] of job.steps.entries()) {
    try {
      result.steps.push({ step: i, ...(await runStep(page, s)) });
    } catch (e) {
      await context.close().catch(() => {});
      return finish(1, `step ${i} ${JSON.stringify(s)} failed: ${e.message.split('\n')[0]}`);
    }
  }
  leaving = true;
  await context.close().catch(() => {});

  if (job.strict ?? true) {
    const problems = [
      ...result.console_errors.map((c) => `console error: ${c.text}`),
      ...result.page_errors.map((p) => `page error: ${p}`),
      // Chromium reports a beacon as aborted when the page that sent it goes away, even once
      // delivered: whether beacons arrived is for the receiver to say. A request still in flight
      // when the job leaves the page (the sampled probe at idle, say) is cancelled by the job, not
      // failed by the page. Any other abort, and every other failure, counts.
      ...result.failed_requests
        .filter((r) => !(r.failure === 'net::ERR_ABORTED' && (r.type === 'ping' || r.left)))
        .map((r) => `request failed: ${r.method} ${r.url} (${r.failure})`),
    ];
    if (problems.length > 0) return finish(1, `strict: ${problems.join('; ')}`);
  }
  return finish(0, null);
}

main().catch((e) => finish(2, `driver error: ${e.stack || e}`));
