// End to end in headless Chromium with WebGPU (--enable-unsafe-webgpu: SwiftShader's Vulkan, a
// CPU implementation, so this is slow and about correctness only): the built hearth-llm package
// loads Gemma 3 270M on backend 'webgpu' in its worker and greedy-generates the same tokens as the
// native CPU backend (the fixture of gemma.test.js: tests/fixtures/browser/generate.sh) — the first
// 15 of its 16: at the 16th the CPU's choice ("elif" over "if" after `return 0`) is a near-tie
// that the GPU's f32 summation order (online softmax per key tile, its own mat-mul reductions)
// resolves the other way.
//
// Needs what gemma.test.js needs.

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { homedir } from 'node:os';
import { chromium } from 'playwright-core';
import { serve } from './server.js';

const root = join(dirname(fileURLToPath(import.meta.url)), '../..');
const dist = join(root, 'web/hearth-llm/dist');
const modelsDir = process.env.HEARTH_MODELS_DIR ?? join(homedir(), '.cache/hearth/models');
const expected = JSON.parse(readFileSync(join(root, 'tests/fixtures/browser/gemma_fibonacci_greedy.json'), 'utf8'));

// Tokens compared with the CPU fixture (see the top of the file).
const COMPARED = 15;

let server, origin, log, browser, page;

before(async () => {
  assert.ok(existsSync(join(dist, 'index.js')), 'web/hearth-llm/dist is missing: run scripts/build-web.sh');
  assert.ok(existsSync(join(modelsDir, expected.model_file)), `${expected.model_file} is missing from ${modelsDir}`);
  ({ server, origin, log } = await serve({ '/dist/': dist, '/models/': modelsDir, '/': dirname(fileURLToPath(import.meta.url)) }));
  browser = await chromium.launch({
    executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium',
    args: ['--no-sandbox', '--disable-background-networking', '--headless=new', '--enable-unsafe-webgpu'],
  });
  page = await (await browser.newContext()).newPage();
  page.on('console', (message) => process.stderr.write(`[page ${message.type()}] ${message.text()}\n`));
  page.on('pageerror', (error) => process.stderr.write(`[page error] ${error}\n`));
  await page.goto(`${origin}/page.html`);
});

after(async () => {
  await browser?.close();
  server?.close();
});

test("backend 'webgpu': greedy tokens equal the native CPU backend", { timeout: 1_800_000 }, async () => {
  const result = await page.evaluate(async ({ modelUrl, prompt, COMPARED }) => {
    const { createEngine } = await import('/dist/index.js');
    const engine = await createEngine({ model: modelUrl, backend: 'webgpu', worker: true, cache: false });
    const stream = await engine.completions.create({ prompt, stream: true, temperature: 0, max_tokens: COMPARED });
    const chunks = [];
    for await (const chunk of stream) chunks.push(chunk);
    const stats = await engine.runtimeStats();
    await engine.unload();
    return { chunks, stats };
  }, { modelUrl: `/models/${expected.model_file}`, prompt: expected.prompt, COMPARED });

  // cache: false in a worker: the model was read with HTTP range requests straight into GPU
  // buffers (tensors in pieces of at most 16 MiB), never downloaded whole.
  const modelPath = `/models/${expected.model_file}`;
  const modelReads = log.filter((entry) => entry.path === modelPath);
  const fileBytes = result.stats.model.file_bytes;
  assert.ok(modelReads.length > 0, JSON.stringify(log));
  assert.deepEqual(modelReads.filter((entry) => entry.status !== 206), [], 'every model request is a range request');
  const largest = Math.max(...modelReads.map((entry) => entry.bytes));
  const total = modelReads.reduce((sum, entry) => sum + entry.bytes, 0);
  assert.ok(largest <= 16 * 2 ** 20, `largest range ${largest} bytes`);
  assert.ok(total >= fileBytes * 0.9 && total <= fileBytes * 1.1, `read ${total} bytes by ranges of a ${fileBytes}-byte file`);
  process.stderr.write(`model read in ${modelReads.length} range requests (largest ${(largest / 2 ** 20).toFixed(1)} MiB, ${(total / 2 ** 20).toFixed(0)} MiB in all)\n`);

  const last = result.chunks.at(-1);
  process.stderr.write(`WebGPU token ids: ${JSON.stringify(last.hearth.token_ids)}\n`);
  assert.equal(result.stats.backend, 'webgpu', JSON.stringify(result.stats));
  // Browsers may hide the adapter's name (SwiftShader's is ''); the API is always the browser's.
  assert.equal(result.stats.adapter?.backend, 'BrowserWebGpu', JSON.stringify(result.stats));
  assert.ok(result.stats.adapter.max_storage_buffer_binding_size > 0);
  assert.equal(typeof result.stats.adapter.shader_f16, 'boolean');
  // On WebGPU the model is never copied into wasm memory: the heap stays well below the file size.
  assert.ok(result.stats.wasm_memory_bytes < result.stats.model.file_bytes / 2, JSON.stringify(result.stats));
  assert.deepEqual(last.hearth.prompt_token_ids, expected.prompt_tokens);
  assert.deepEqual(last.hearth.token_ids, expected.tokens.slice(0, COMPARED));
  const text = result.chunks.map((c) => c.choices[0].text).join('');
  assert.ok(text.length > 0 && expected.text.startsWith(text), `${JSON.stringify(text)} is not a prefix of ${JSON.stringify(expected.text)}`);
  assert.equal(last.choices[0].finish_reason, 'length');
  process.stderr.write(`WebGPU (${result.stats.adapter.device_type} adapter): ttft ${last.usage.ttft_ms.toFixed(0)} ms, prefill ${last.usage.prefill_tok_s.toFixed(1)} tok/s, decode ${last.usage.decode_tok_s.toFixed(1)} tok/s, wasm memory ${(result.stats.wasm_memory_bytes / 2 ** 20).toFixed(0)} MiB\n`);
});

test("backend 'auto' skips a software adapter (SwiftShader) for the wasm CPU engine, and says why", { timeout: 900_000 }, async () => {
  const stats = await page.evaluate(async ({ modelUrl }) => {
    const { createEngine } = await import('/dist/index.js');
    const engine = await createEngine({ model: modelUrl, worker: false, cache: false });
    const stats = await engine.runtimeStats();
    await engine.unload();
    return stats;
  }, { modelUrl: `/models/${expected.model_file}` });
  // This test machine has no GPU: Chromium's only adapter is SwiftShader (device type Cpu).
  assert.equal(stats.backend, 'cpu-wasm', JSON.stringify(stats));
  assert.match(stats.fallback_reason, /software renderer/);
});

test("a lost GPU device fails requests with code 'device-lost'; loading again works", { timeout: 1_800_000 }, async () => {
  const result = await page.evaluate(async ({ modelUrl, prompt }) => {
    const { createEngine } = await import('/dist/index.js');
    const engine = await createEngine({ model: modelUrl, backend: 'webgpu', worker: true, cache: false });
    const describe = (e) => ({ name: e.name, code: e.code, message: e.message });
    let destroyed = false;
    let error = null;
    try {
      // max_tokens leaves steps to run after the device is destroyed at the first chunk.
      for await (const chunk of await engine.completions.create({ prompt, stream: true, temperature: 0, max_tokens: 6 })) {
        if (!destroyed && chunk.choices[0].text) destroyed = await engine._loseDeviceForTest();
      }
    } catch (e) {
      error = describe(e);
    }
    // The device stays lost: the next request fails the same way.
    const next = await engine.completions.create({ prompt, max_tokens: 1 }).then(() => null, describe);
    await engine.unload().catch(() => {});
    const reloaded = await createEngine({ model: modelUrl, backend: 'webgpu', worker: true, cache: false });
    const after = await reloaded.completions.create({ prompt, temperature: 0, max_tokens: 2 });
    await reloaded.unload();
    return { destroyed, error, next, tokens: after.hearth.token_ids };
  }, { modelUrl: `/models/${expected.model_file}`, prompt: expected.prompt });
  assert.equal(result.destroyed, true);
  assert.equal(result.error?.name, 'HearthError', JSON.stringify(result));
  assert.equal(result.error.code, 'device-lost', JSON.stringify(result));
  assert.match(result.error.message, /GPU device was lost/);
  assert.equal(result.next?.code, 'device-lost', JSON.stringify(result));
  assert.deepEqual(result.tokens, expected.tokens.slice(0, 2));
});
