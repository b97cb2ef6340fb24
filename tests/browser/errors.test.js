// Errors at the JS edge are HearthErrors with stable codes, in headless Chromium launched WITHOUT
// --enable-unsafe-webgpu (so there is no WebGPU adapter): a truncated GGUF, a GGUF of an unknown
// architecture, bad request and createEngine arguments, backend 'webgpu' without an adapter, a
// missing URL, and aborts. Worker-mode errors cross the worker boundary and are still HearthErrors.
//
// Needs what gemma.test.js needs.

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { homedir } from 'node:os';
import { fileURLToPath } from 'node:url';
import { createServer } from 'node:http';
import { chromium } from 'playwright-core';
import { serve } from './server.js';

const here = dirname(fileURLToPath(import.meta.url));
const root = join(here, '../..');
const dist = join(root, 'web/hearth-llm/dist');
const modelsDir = process.env.HEARTH_MODELS_DIR ?? join(homedir(), '.cache/hearth/models');
const expected = JSON.parse(readFileSync(join(root, 'tests/fixtures/browser/gemma_fibonacci_greedy.json'), 'utf8'));

let server, browser, page, hugeServer, hugeOrigin;
const pageErrors = [];

before(async () => {
  assert.ok(existsSync(join(dist, 'index.js')), 'web/hearth-llm/dist is missing: run scripts/build-web.sh');
  ({ server } = await serve({ '/dist/': dist, '/models/': modelsDir, '/fixtures/': join(root, 'tests/fixtures'), '/': here }));
  const { origin } = { origin: `http://127.0.0.1:${server.address().port}` };
  // Announces a 5 GB model and never sends it: more than a wasm32 engine can hold.
  hugeServer = createServer((request, response) => {
    response.writeHead(200, { 'content-length': '5000000000', 'access-control-allow-origin': '*', 'cross-origin-resource-policy': 'cross-origin' });
    response.flushHeaders();
  });
  await new Promise((resolve) => hugeServer.listen(0, '127.0.0.1', resolve));
  hugeOrigin = `http://127.0.0.1:${hugeServer.address().port}`;
  browser = await chromium.launch({
    executablePath: process.env.HEARTH_CHROMIUM ?? '/usr/bin/chromium',
    args: ['--no-sandbox', '--disable-background-networking', '--headless=new'], // no --enable-unsafe-webgpu
  });
  page = await browser.newPage();
  page.on('pageerror', (error) => pageErrors.push(String(error)));
  await page.goto(`${origin}/page.html`);
  await page.evaluate(async () => {
    const { HearthError } = await import('/dist/index.js');
    // { instance, name, code, message, kind } of what `promise` rejects with (handled at once, so
    // the page never sees an unhandled rejection).
    window.describe = (promise) => promise.then(() => ({ code: 'no error' }), (e) => ({ instance: e instanceof HearthError, name: e.name, code: e.code, message: e.message, param: e.param }));
  });
});

after(async () => {
  await browser?.close();
  server?.close();
  hugeServer?.closeAllConnections();
  hugeServer?.close();
});

function assertError(actual, code, pattern) {
  assert.equal(actual.code, code, JSON.stringify(actual));
  assert.equal(actual.instance, true, JSON.stringify(actual));
  assert.equal(actual.name, 'HearthError');
  assert.match(actual.message, /^hearth-llm: /);
  if (pattern) assert.match(actual.message, pattern);
}

test('a truncated GGUF and an unknown architecture are invalid-model / unsupported-model (worker and same thread)', { timeout: 300_000 }, async () => {
  const result = await page.evaluate(async ({ modelUrl }) => {
    const { createEngine } = await import('/dist/index.js');
    // The first 4 MiB of Gemma: a valid header whose tensor data runs past the end.
    const head = new Uint8Array(await (await fetch(modelUrl, { headers: { range: 'bytes=0-4194303' } })).arrayBuffer()).slice(0, 4 << 20);
    const synthetic = new Uint8Array(await (await fetch('/fixtures/synthetic/llama-gqa-q8_0.gguf')).arrayBuffer());
    const key = new TextEncoder().encode('general.architecture');
    const at = synthetic.findIndex((_, i) => key.every((b, j) => synthetic[i + j] === b)) + key.length + 4 + 8;
    synthetic[at] = 'x'.charCodeAt(0); // "llama" → "xlama"
    return {
      truncatedWorker: await describe(createEngine({ model: head, worker: true })),
      truncatedLocal: await describe(createEngine({ model: head.slice(), worker: false })),
      notGguf: await describe(createEngine({ model: new TextEncoder().encode('<!doctype html><p>404</p>') })),
      unknownArch: await describe(createEngine({ model: synthetic, worker: true })),
    };
  }, { modelUrl: `/models/${expected.model_file}` });
  assertError(result.truncatedWorker, 'invalid-model', /truncated.*Download it again/);
  assertError(result.truncatedLocal, 'invalid-model', /truncated/);
  assertError(result.notGguf, 'invalid-model', /not a GGUF file/);
  assertError(result.unknownArch, 'unsupported-model', /unsupported architecture 'xlama'.*try another model/);
});

test('bad arguments are bad-argument errors naming the field', { timeout: 300_000 }, async () => {
  const result = await page.evaluate(async () => {
    const { createEngine } = await import('/dist/index.js');
    const engine = await createEngine({ model: await (await fetch('/fixtures/synthetic/gemma3-swa-q8_0.gguf')).arrayBuffer(), worker: false });
    const out = {
      messagesNotArray: await describe(engine.chat.completions.create({ messages: 'hi' })),
      temperatureString: await describe(engine.completions.create({ prompt: 'x', temperature: '0.7' })),
      temperatureNegative: await describe(engine.completions.create({ prompt: 'x', temperature: -1 })),
      unknownField: await describe(engine.completions.create({ prompt: 'x', temprature: 1 })),
      noOptions: await describe(createEngine()),
      noModel: await describe(createEngine({})),
      modelNumber: await describe(createEngine({ model: 5 })),
      nCtx: await describe(createEngine({ model: '/x.gguf', nCtx: -1 })),
      backend: await describe(createEngine({ model: '/x.gguf', backend: 'cuda' })),
      cache: await describe(createEngine({ model: '/x.gguf', cache: 'yes' })),
      lookupMinP: await describe(engine.completions.create({ prompt: 'x', speculative: { mode: 'lookup', draftMinP: 0.5 } })),
      // What the engine cannot do is refused, never ignored: a schema keyword it cannot enforce,
      // tools outside a chat, a field it does not implement.
      responseFormat: await describe(engine.completions.create({ prompt: 'x', response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'object', properties: { a: { type: 'string', format: 'no-such-format' } } } } } })),
      tools: await describe(engine.completions.create({ prompt: 'x', tools: [{ type: 'function', function: { name: 'f' } }] })),
      suffix: await describe(engine.completions.create({ prompt: 'x', suffix: 'y' })),
      // More choices than a request may ask for.
      choices: await describe(engine.completions.create({ prompt: 'x', n: 17 })),
      // A limit past the context is refused as the server refuses it (no limit: to its end).
      pastContext: await describe(engine.completions.create({ prompt: 'x', max_tokens: 1_000_000 })),
      // The request crosses into wasm as a JS object: a non-finite number reaches the core's
      // validation as it is (JSON would have carried it as null, "not given").
      temperatureNaN: await describe(engine.completions.create({ prompt: 'x', temperature: NaN })),
      topPInfinity: await describe(engine.completions.create({ prompt: 'x', top_p: Infinity })),
      logitBiasNaN: await describe(engine.completions.create({ prompt: 'x', logit_bias: { 5: NaN } })),
      // A free-form field (a JSON value in the schema) has no NaN: refused by name, not read as null.
      logprobsNaN: await describe(engine.chat.completions.create({ messages: [{ role: 'user', content: 'x' }], logprobs: NaN })),
      contentInfinity: await describe(engine.chat.completions.create({ messages: [{ role: 'user', content: 'x', weight: -Infinity }] })),
      // Every property of a nested object is read, so a typo there is refused too.
      nestedUnknownField: await describe(engine.completions.create({ prompt: 'x', speculative: { mode: 'lookup', draftTokns: 3 } })),
      seedOutOfRange: await describe(engine.completions.create({ prompt: 'x', seed: 2n ** 70n })),
      // A refused streaming request rejects at create(), as a server's 400 comes before any event.
      streamRefused: await describe(engine.completions.create({ prompt: 'x', stream: true, temperature: 5 })),
    };
    // An undefined property is an absent one, as in JSON; a BigInt seed is an integer.
    const accepted = await engine.completions.create({ prompt: 'x', max_tokens: 1, ignore_eos: true, temperature: undefined, tempreature: undefined, seed: 7n });
    out.undefinedAndBigInt = { tokens: accepted.usage.completion_tokens, seed: accepted.hearth.seed };
    await engine.unload();
    out.afterUnload = await describe(engine.completions.create({ prompt: 'x' }));
    // Through the worker (structured clone) NaN still reaches the core as NaN.
    const inWorker = await createEngine({ model: await (await fetch('/fixtures/synthetic/gemma3-swa-q8_0.gguf')).arrayBuffer(), worker: true });
    out.temperatureNaNWorker = await describe(inWorker.completions.create({ prompt: 'x', temperature: NaN }));
    await inWorker.unload();
    return out;
  });
  for (const [name, pattern] of Object.entries({
    messagesNotArray: /messages: invalid type: string "hi", expected a sequence/, temperatureString: /temperature: invalid type: string "0.7"/,
    temperatureNegative: /temperature must be between 0 and 2, got -1/, unknownField: /unknown field `temprature`/,
    noOptions: /options object/, noModel: /`model` is required/, modelNumber: /`model` must be a URL/, nCtx: /`nCtx`/,
    backend: /`backend` must be one of 'auto', 'cpu', 'webgpu', got "cuda"/, cache: /`cache`/,
    lookupMinP: /speculative\.draft_min_p \(draftMinP\) applies to mode 'draft-model'/,
    responseFormat: /response_format: .*no-such-format/, tools: /tools belong to chat completions/, suffix: /suffix is not supported yet/,
    choices: /n must be between 1 and 16, got 17/,
    temperatureNaN: /temperature must be between 0 and 2, got NaN\./, temperatureNaNWorker: /temperature must be between 0 and 2, got NaN\./,
    topPInfinity: /top_p must be between 0 and 1, got inf\./, logitBiasNaN: /logit_bias values must be in \[-100, 100\], got NaN\./,
    logprobsNaN: /logprobs: invalid value: floating point `NaN`, expected a finite number/,
    contentInfinity: /messages\[0\]\.weight: invalid value: floating point `-inf`, expected a finite number/,
    nestedUnknownField: /speculative\.draftTokns: unknown field `draftTokns`/, seedOutOfRange: /seed: .*BigInt/,
    streamRefused: /temperature must be between 0 and 2, got 5/,
  })) assertError(result[name], 'bad-argument', pattern);
  // The refused field is named, as `hearth serve` names it in its 400s.
  for (const name of ['temperatureString', 'temperatureNegative', 'temperatureNaN', 'temperatureNaNWorker']) assert.equal(result[name].param, 'temperature', name);
  for (const [name, param] of Object.entries({ responseFormat: 'response_format', tools: 'tools', suffix: 'suffix', topPInfinity: 'top_p', logitBiasNaN: 'logit_bias', logprobsNaN: 'logprobs', contentInfinity: 'messages', nestedUnknownField: 'speculative', seedOutOfRange: 'seed' })) {
    assert.equal(result[name].param, param, name);
  }
  assert.deepEqual(result.undefinedAndBigInt, { tokens: 1, seed: 7 });
  assert.equal(result.messagesNotArray.param, 'messages');
  assert.equal(result.lookupMinP.param, 'speculative');
  assert.equal(result.choices.param, 'n');
  assertError(result.pastContext, 'context-overflow', /context overflow: 100000\d tokens needed/);
  assertError(result.afterUnload, 'not-loaded', /unloaded/);
});

test("backend: 'webgpu' without an adapter is no-webgpu, before any download", { timeout: 120_000 }, async () => {
  const result = await page.evaluate(async ({ modelUrl }) => {
    const { createEngine } = await import('/dist/index.js');
    const before = performance.getEntriesByType('resource').length;
    const error = await describe(createEngine({ model: modelUrl, backend: 'webgpu' }));
    const adapter = navigator.gpu ? await navigator.gpu.requestAdapter() : null;
    return { error, hasAdapter: Boolean(adapter), downloads: performance.getEntriesByType('resource').slice(before).filter((e) => e.name.endsWith('.gguf')).length };
  }, { modelUrl: `/models/${expected.model_file}` });
  assert.equal(result.hasAdapter, false, 'this Chromium has a WebGPU adapter: the test needs a browser without one');
  assertError(result.error, 'no-webgpu', /no WebGPU adapter.*backend: 'cpu'/);
  assert.equal(result.downloads, 0);
});

test('a missing URL is a network error; aborts are aborted', { timeout: 120_000 }, async () => {
  const result = await page.evaluate(async () => {
    const { createEngine } = await import('/dist/index.js');
    const controller = new AbortController();
    controller.abort();
    const engine = await createEngine({ model: await (await fetch('/fixtures/synthetic/gemma3-swa-q8_0.gguf')).arrayBuffer(), worker: true });
    const out = {
      notFound: await describe(createEngine({ model: '/models/missing.gguf' })),
      abortedLoad: await describe(createEngine({ model: '/models/missing.gguf', signal: controller.signal })),
      abortedRequest: await describe(engine.completions.create({ prompt: 'x', max_tokens: 2, signal: controller.signal })),
    };
    await engine.unload();
    return out;
  });
  assertError(result.notFound, 'network', /HTTP 404/);
  assertError(result.abortedLoad, 'aborted');
  assertError(result.abortedRequest, 'aborted');
});

test('a model larger than the wasm engine can hold is out-of-memory, before it downloads', { timeout: 120_000 }, async () => {
  const result = await page.evaluate(async (url) => describe((await import('/dist/index.js')).createEngine({ model: url })), `${hugeOrigin}/huge.gguf`);
  assertError(result, 'out-of-memory', /the model is 4\.66 GiB, but the WebAssembly engine can hold at most 3\.94 GiB.*smaller model/);
});

test('no unhandled errors in the page', () => {
  assert.deepEqual(pageErrors, []);
});
