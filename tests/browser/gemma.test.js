// End to end in headless Chromium: the built hearth-llm package loads Gemma 3 270M (worker mode,
// CPU fallback in wasm) and greedy-generates the same 16 tokens as the native CPU backend.
//
// Needs: scripts/build-web.sh (web/hearth-llm/dist), `npm install` at the repo root
// (playwright-core), Chromium at /usr/bin/chromium (or $CHROMIUM), and the model in
// $HEARTH_MODELS_DIR or ~/.cache/hearth/models. Expected ids: tests/fixtures/browser/ (generate.sh).

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { homedir } from 'node:os';
import { launchChromium, openTestPage, serve } from './server.js';

const root = join(dirname(fileURLToPath(import.meta.url)), '../..');
const dist = join(root, 'web/hearth-llm/dist');
const modelsDir = process.env.HEARTH_MODELS_DIR ?? join(homedir(), '.cache/hearth/models');
const expected = JSON.parse(readFileSync(join(root, 'tests/fixtures/browser/gemma_fibonacci_greedy.json'), 'utf8'));

let server, origin, browser, page;
const requests = [];

before(async () => {
  assert.ok(existsSync(join(dist, 'index.js')), 'web/hearth-llm/dist is missing: run scripts/build-web.sh');
  assert.ok(existsSync(join(modelsDir, expected.model_file)), `${expected.model_file} is missing from ${modelsDir} (hearth models fetch gemma-3-270m)`);
  ({ server, origin } = await serve({ '/dist/': dist, '/models/': modelsDir, '/': dirname(fileURLToPath(import.meta.url)) }));
  browser = await launchChromium();
  page = await openTestPage(browser, origin, (url) => requests.push(url));
});

after(async () => {
  await browser?.close();
  server?.close();
});

test('worker mode: greedy tokens equal the native CPU backend', { timeout: 600_000 }, async () => {
  const result = await page.evaluate(async ({ modelUrl, prompt }) => {
    const { createEngine } = await import('/dist/index.js');
    const phases = new Set();
    const engine = await createEngine({ model: modelUrl, worker: true, onProgress: (p) => phases.add(p.phase) });
    window.engine = engine;
    const stream = await engine.completions.create({ prompt, stream: true, temperature: 0, max_tokens: 16 });
    const chunks = [];
    for await (const chunk of stream) chunks.push(chunk);
    const stats = await engine.runtimeStats();
    return { chunks, stats, phases: [...phases] };
  }, { modelUrl: `/models/${expected.model_file}`, prompt: expected.prompt });

  const last = result.chunks.at(-1);
  assert.deepEqual(last.hearth.prompt_token_ids, expected.prompt_tokens);
  assert.deepEqual(last.hearth.token_ids, expected.tokens);
  assert.equal(result.chunks.map((c) => c.choices[0].text).join(''), expected.text);
  assert.equal(last.choices[0].finish_reason, 'length');
  assert.ok(result.chunks.every((c) => c.object === 'text_completion' && c.id === last.id));
  assert.equal(last.usage.completion_tokens, 16);
  assert.equal(last.usage.prompt_tokens, expected.prompt_tokens.length);
  assert.ok(last.usage.ttft_ms > 0 && last.usage.decode_tok_s > 0 && last.usage.prefill_tok_s > 0, JSON.stringify(last.usage));
  assert.equal(result.stats.backend, 'cpu-wasm');
  assert.equal(result.stats.simd128, true);
  assert.equal(result.stats.worker, true);
  assert.equal(result.stats.model.architecture, 'gemma3');
  assert.deepEqual(result.phases.sort(), ['download', 'load', 'ready']);
  process.stderr.write(`wasm CPU: ttft ${last.usage.ttft_ms.toFixed(0)} ms, prefill ${last.usage.prefill_tok_s.toFixed(1)} tok/s, decode ${last.usage.decode_tok_s.toFixed(1)} tok/s\n`);
});

test('two concurrent calls (batched) each give the greedy tokens; chat without a template is a clear error', { timeout: 600_000 }, async () => {
  const result = await page.evaluate(async ({ prompt }) => {
    const request = { prompt, temperature: 0, max_tokens: 6 };
    const [a, b] = await Promise.all([window.engine.completions.create(request), window.engine.completions.create(request)]);
    // The Gemma 270M GGUF has no chat template: chat requests must fail clearly (streaming too).
    const chat = await window.engine.chat.completions.create({ messages: [{ role: 'user', content: 'Say hello.' }], stream: true, max_tokens: 8 })
      .then(async (stream) => { for await (const _ of stream); return 'no error'; }, (e) => e.message)
      .catch((e) => e.message);
    return { a, b, chat };
  }, { prompt: expected.prompt });
  assert.deepEqual(result.a.hearth.token_ids, expected.tokens.slice(0, 6));
  assert.deepEqual(result.b.hearth.token_ids, expected.tokens.slice(0, 6));
  assert.equal(result.a.object, 'text_completion');
  assert.equal(result.a.choices[0].finish_reason, 'length');
  assert.match(result.chat, /no chat template/);
});

test('bad arguments and bad models are clear errors', { timeout: 120_000 }, async () => {
  const errors = await page.evaluate(async () => {
    const { createEngine } = await import('/dist/index.js');
    const describe = async (promise) => promise.then(() => 'no error', (e) => `${e.name}: ${e.message}`);
    return {
      messages: await describe(window.engine.chat.completions.create({ messages: 'hi' })),
      temperature: await describe(window.engine.completions.create({ prompt: 'x', temperature: -1 })),
      unknown: await describe(window.engine.completions.create({ prompt: 'x', temprature: 1 })),
      noModel: await describe(createEngine({})),
      notGguf: await describe(createEngine({ model: new TextEncoder().encode('definitely not a model'), worker: true })),
      notFound: await describe(createEngine({ model: '/models/missing.gguf' })),
    };
  });
  assert.match(errors.messages, /^HearthError: .*messages/);
  assert.match(errors.temperature, /^HearthError: .*temperature/);
  assert.match(errors.unknown, /^HearthError: .*temprature/);
  assert.match(errors.noModel, /^HearthError: .*model/);
  assert.match(errors.notGguf, /^HearthError: .*not a GGUF file/);
  assert.match(errors.notFound, /^HearthError: .*HTTP 404/);
});

test('no request left the page origin', () => {
  assert.ok(requests.length > 0);
  const foreign = requests.filter((url) => !url.startsWith(`${origin}/`));
  assert.deepEqual(foreign, []);
});
