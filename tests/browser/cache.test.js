// The model cache in headless Chromium: Gemma 3 270M loaded from a URL is written to OPFS while it
// downloads; a second createEngine for the same URL — in a new browser process on the same profile —
// issues no request for the .gguf (counted by Playwright request interception) and generates the same
// greedy tokens as the native CPU backend (tests/fixtures/browser). Then: listCachedModels /
// deleteCachedModel, `cache: false`, a storage quota too small for the model (load proceeds uncached,
// with a 'quota-exceeded' warning), and the Cache Storage fallback.
//
// Needs what gemma.test.js needs.

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, readFileSync, rmSync, statSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { tmpdir, homedir } from 'node:os';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';
import { serve } from './server.js';

const here = dirname(fileURLToPath(import.meta.url));
const root = join(here, '../..');
const dist = join(root, 'web/hearth-llm/dist');
const modelsDir = process.env.HEARTH_MODELS_DIR ?? join(homedir(), '.cache/hearth/models');
const expected = JSON.parse(readFileSync(join(root, 'tests/fixtures/browser/gemma_fibonacci_greedy.json'), 'utf8'));
const modelPath = `/models/${expected.model_file}`;

let server, origin, profile, context, page;
let modelRequests = 0;
const modelMethods = [];

async function openBrowser() {
  context = await chromium.launchPersistentContext(profile, {
    executablePath: process.env.HEARTH_CHROMIUM ?? '/usr/bin/chromium',
    args: ['--no-sandbox', '--disable-background-networking', '--headless=new'],
  });
  // Interception: every request for a .gguf is counted, then let through.
  await context.route('**/*.gguf', (route) => {
    modelRequests++;
    modelMethods.push(route.request().method());
    return route.continue();
  });
  page = context.pages()[0] ?? (await context.newPage());
  page.on('console', (message) => process.stderr.write(`[page ${message.type()}] ${message.text()}\n`));
  page.on('pageerror', (error) => process.stderr.write(`[page error] ${error}\n`));
  await page.goto(`${origin}/page.html`);
}

/** createEngine in the page → { phases, fromCache flags, warnings, token ids, cached list }. */
function loadAndGenerate(options = {}) {
  return page.evaluate(async ({ modelUrl, prompt, options }) => {
    const { createEngine, listCachedModels } = await import('/dist/index.js');
    const events = [];
    const engine = await createEngine({ model: modelUrl, worker: true, ...options, onProgress: (p) => events.push(p) });
    const reply = await engine.completions.create({ prompt, temperature: 0, max_tokens: 16 });
    await engine.unload();
    const phases = [...new Set(events.map((e) => e.phase))];
    const warnings = [...new Set(events.filter((e) => e.warning).map((e) => `${e.warning.code}: ${e.warning.message}`))];
    const last = events.filter((e) => e.phase === 'download' || e.phase === 'cache').at(-1);
    return { phases, fromCache: engine.fromCache, eventsFromCache: [...new Set(events.map((e) => e.fromCache))], warnings, engineWarnings: engine.warnings.map((w) => w.code), last, tokens: reply.hearth.token_ids, cached: await listCachedModels() };
  }, { modelUrl: modelPath, prompt: expected.prompt, options });
}

before(async () => {
  assert.ok(existsSync(join(dist, 'index.js')), 'web/hearth-llm/dist is missing: run scripts/build-web.sh');
  assert.ok(existsSync(join(modelsDir, expected.model_file)), `${expected.model_file} is missing from ${modelsDir}`);
  ({ server, origin } = await serve({ '/dist/': dist, '/models/': modelsDir, '/': here }));
  profile = mkdtempSync(join(tmpdir(), 'hearth-cache-profile-'));
  await openBrowser();
});

after(async () => {
  await context?.close();
  server?.close();
  if (profile) rmSync(profile, { recursive: true, force: true });
});

const size = () => statSync(join(modelsDir, expected.model_file)).size;

test('first load downloads and caches in OPFS; the second (new browser, same profile) makes no request', { timeout: 900_000 }, async () => {
  const first = await loadAndGenerate();
  assert.equal(modelRequests, 1);
  assert.deepEqual(first.phases, ['download', 'load', 'ready']);
  assert.equal(first.fromCache, false);
  assert.deepEqual(first.eventsFromCache, [false]);
  assert.deepEqual(first.warnings, []);
  assert.deepEqual(first.last, { phase: 'download', loaded: size(), total: size(), fromCache: false, cached: true });
  assert.deepEqual(first.tokens, expected.tokens);
  assert.equal(first.cached.length, 1);
  assert.deepEqual({ ...first.cached[0], storedAt: 0 }, { url: `${origin}${modelPath}`, size: size(), etag: null, storedAt: 0, storage: 'opfs' });

  await context.close();
  modelRequests = 0;
  await openBrowser();
  const second = await loadAndGenerate();
  assert.equal(modelRequests, 0, 'the second load requested the model');
  assert.deepEqual(second.phases, ['cache', 'load', 'ready']);
  assert.equal(second.fromCache, true);
  assert.deepEqual(second.eventsFromCache, [true]);
  assert.deepEqual(second.last, { phase: 'cache', loaded: size(), total: size(), fromCache: true });
  assert.deepEqual(second.tokens, first.tokens);
});

test('deleteCachedModel removes the entry; cache: false neither reads nor writes it', { timeout: 900_000 }, async () => {
  const deleted = await page.evaluate(async (url) => {
    const { deleteCachedModel, listCachedModels } = await import('/dist/index.js');
    return { removed: await deleteCachedModel(url), again: await deleteCachedModel(url), list: await listCachedModels() };
  }, modelPath);
  assert.deepEqual(deleted, { removed: true, again: false, list: [] });

  modelRequests = 0;
  const uncached = await loadAndGenerate({ cache: false });
  // Downloaded again: in one request, or (a worker that may load onto WebGPU reads the model range
  // by range) in range requests.
  assert.ok(modelRequests >= 1, `${modelRequests} model requests`);
  assert.equal(uncached.fromCache, false);
  // No download event says it is being cached (a range-read load has no download events at all).
  assert.ok(!uncached.last?.cached, JSON.stringify(uncached.last));
  assert.deepEqual(uncached.cached, []);
  assert.deepEqual(uncached.tokens, expected.tokens);
});

test('a storage quota smaller than the model: the load proceeds uncached and says so', { timeout: 900_000 }, async () => {
  const cdp = await context.newCDPSession(page);
  await cdp.send('Storage.overrideQuotaForOrigin', { origin, quotaSize: 50 * 2 ** 20 });
  try {
    const result = await loadAndGenerate();
    assert.equal(result.fromCache, false);
    assert.equal(result.warnings.length, 1, JSON.stringify(result.warnings));
    assert.match(result.warnings[0], /^quota-exceeded: hearth-llm: .*(storage|quota).*loaded without caching/);
    assert.deepEqual(result.engineWarnings, ['quota-exceeded']);
    assert.deepEqual(result.cached, []);
    assert.deepEqual(result.tokens, expected.tokens);
  } finally {
    await cdp.send('Storage.overrideQuotaForOrigin', { origin });
  }
});

test('Cache Storage fallback (no OPFS): the second load makes no request either', { timeout: 900_000 }, async () => {
  await page.evaluate(async () => {
    const cache = await import('/dist/cache.js');
    cache.resetCacheStore();
    await cache.openCache({ preferOpfs: false }); // what a browser without OPFS gets
  });
  modelRequests = 0;
  const first = await loadAndGenerate();
  assert.equal(modelRequests, 1);
  assert.deepEqual(first.cached.map((e) => [e.storage, e.size]), [['cache-storage', size()]]);
  const second = await loadAndGenerate();
  assert.equal(modelRequests, 1, 'the second load requested the model');
  assert.equal(second.fromCache, true);
  assert.deepEqual(second.phases, ['cache', 'load', 'ready']);
  assert.deepEqual(second.tokens, expected.tokens);

  // cache: 'revalidate' asks the server with a HEAD (same Content-Length: the cached copy is used).
  modelMethods.length = 0;
  const revalidated = await loadAndGenerate({ cache: 'revalidate' });
  assert.deepEqual(modelMethods, ['HEAD']);
  assert.equal(revalidated.fromCache, true);
  assert.equal(await page.evaluate(async (url) => (await import('/dist/index.js')).deleteCachedModel(url), modelPath), true);
});
