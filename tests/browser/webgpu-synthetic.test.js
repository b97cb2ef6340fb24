// The WebGPU engine's behaviours on a tiny model in headless Chromium (--enable-unsafe-webgpu:
// SwiftShader, Vulkan on the CPU, so about correctness only):
// - speculative decoding entirely on WebGPU: the target AND its draft model on WebGPU (the draft on
//   a device of its own, `draftBackend` defaulting to the target's backend), the draft's forward
//   passes awaited like the target's; and a prompt-lookup request on the same WebGPU engine;
// - a draft on the wasm CPU engine (`draftBackend: 'cpu'`) drafting for a WebGPU target;
// - structured output: a choice, the constraint's mask applied to the GPU's logits (the model's
//   byte-level vocabulary spells any text; its random weights prefer none of the choices);
// - a lost GPU device: requests fail with code 'device-lost', and loading again works.
// Each speculative request must give exactly the plain greedy tokens, which must be the native CPU
// backend's (tests/fixtures/browser/synthetic_qwen2_repeat_greedy.json, made by generate.sh).
//
// To keep SwiftShader time small the model is the tiny synthetic qwen2 of tests/fixtures/synthetic
// (f32 weights, random, 380 tokens), drafting for itself: the draft computes each row exactly as
// the verification pass does (every wgpu kernel computes a row the same way whatever the batch,
// crates/hearth-wgpu/tests/speculative.rs; the CPU's rows differ from the GPU's only in summation
// order), so its drafts are accepted. The prompt is a repeated pattern on which the model's greedy
// output settles into a repetition after one token, so prompt lookup finds 2-token matches early.
// Every step of the fixture is decisive (CPU top-1 / top-2 margin >= 0.6 nats), so WebGPU's other
// summation order cannot flip a token: the tokens are compared exactly.
//
// Needs scripts/build-web.sh, playwright-core (npm install) and Chromium; no downloaded model.

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { launchChromium, openTestPage, serve, WEBGPU } from './server.js';

const root = join(dirname(fileURLToPath(import.meta.url)), '../..');
const dist = join(root, 'web/hearth-llm/dist');
const synthetic = join(root, 'tests/fixtures/synthetic');
const expected = JSON.parse(readFileSync(join(root, 'tests/fixtures/browser/synthetic_qwen2_repeat_greedy.json'), 'utf8'));
// Below this CPU margin (nats) a different f32 summation order could flip the greedy choice
// (the rule of webgpu.test.js); the fixture must be above it at every step.
const DECISIVE_MARGIN = 0.5;

let server, origin, log, browser, page;

before(async () => {
  assert.ok(existsSync(join(dist, 'index.js')), 'web/hearth-llm/dist is missing: run scripts/build-web.sh');
  // The draft is the same file under another path, so that its range requests can be told apart.
  ({ server, origin, log } = await serve({ '/dist/': dist, '/models/': synthetic, '/draft/': synthetic, '/': dirname(fileURLToPath(import.meta.url)) }));
  browser = await launchChromium(WEBGPU);
  page = await openTestPage(browser, origin);
});

after(async () => {
  await browser?.close();
  server?.close();
});

test('a draft model on WebGPU drafting for a WebGPU target, and prompt lookup on WebGPU, keep the greedy tokens of the native CPU backend', { timeout: 1_800_000 }, async () => {
  assert.deepEqual(expected.margins.filter((m) => m < DECISIVE_MARGIN), [], 'the fixture has a near-tie: pick another prompt in generate.sh');
  const result = await page.evaluate(async ({ modelUrl, draftUrl, prompt, maxTokens }) => {
    const { createEngine } = await import('/dist/index.js');
    const describe = (e) => `${e.name} ${e.code}: ${e.message}`;
    const badDraftBackend = await createEngine({ model: modelUrl, draftModel: draftUrl, draftBackend: 'gpu' }).then(() => 'no error', describe);
    // No draftBackend: the draft runs where the target does (WebGPU).
    const engine = await createEngine({ model: modelUrl, draftModel: draftUrl, backend: 'webgpu', worker: true, cache: false });
    const stats = await engine.runtimeStats();
    const greedy = { prompt, temperature: 0, max_tokens: maxTokens, ignore_eos: true };
    const plain = await engine.completions.create(greedy);
    console.log(`plain greedy: ${JSON.stringify(plain.hearth.token_ids)}`);
    // A random-weights draft is rarely confident: draftMinP 0 drafts the full length.
    const drafted = await engine.completions.create({ ...greedy, speculative: { mode: 'draft-model', draftTokens: 3, draftMinP: 0, fixedLength: true } });
    console.log(`draft-model: ${JSON.stringify(drafted.hearth.token_ids)}, ${JSON.stringify(drafted.usage.speculative)}`);
    const lookup = await engine.completions.create({ ...greedy, speculative: { mode: 'lookup', draftTokens: 4, fixedLength: true } });
    console.log(`lookup: ${JSON.stringify(lookup.hearth.token_ids)}, ${JSON.stringify(lookup.usage.speculative)}`);
    const both = await engine.completions.create({ ...greedy, speculative: { mode: 'draft-model', lookup: true, draftTokens: 3, draftMinP: 0, fixedLength: true } });
    console.log(`lookup then draft-model: ${JSON.stringify(both.hearth.token_ids)}, ${JSON.stringify(both.usage.speculative)}`);
    const badMinP = await engine.completions.create({ ...greedy, speculative: { mode: 'draft-model', draftMinP: 2 } }).then(() => 'no error', describe);
    const badLookup = await engine.completions.create({ ...greedy, speculative: { mode: 'lookup', lookup: true } }).then(() => 'no error', describe);
    const statsAfter = await engine.runtimeStats();
    await engine.unload();
    return { badDraftBackend, stats, plain, drafted, lookup, both, badMinP, badLookup, statsAfter };
  }, { modelUrl: `/models/${expected.model_file}`, draftUrl: `/draft/${expected.model_file}`, prompt: expected.prompt, maxTokens: expected.tokens.length });

  assert.match(result.badDraftBackend, /^HearthError bad-argument: .*draftBackend/);
  assert.match(result.badMinP, /^HearthError bad-argument: .*draftMinP/);
  assert.match(result.badLookup, /^HearthError bad-argument: .*speculative.lookup goes with mode 'draft-model'/);

  // Both models on WebGPU, each on its own device.
  for (const stats of [result.stats, result.statsAfter]) {
    assert.equal(stats.backend, 'webgpu', JSON.stringify(stats));
    assert.equal(stats.draft_model, true);
    assert.equal(stats.draft?.backend, 'webgpu', JSON.stringify(stats.draft));
    assert.equal(stats.draft.adapter?.backend, 'BrowserWebGpu', JSON.stringify(stats.draft));
    assert.equal(stats.draft.fallback_reason, null);
  }
  assert.ok(result.stats.draft.backend_memory_bytes > 0, JSON.stringify(result.stats.draft));
  // In the worker the draft was read with range requests straight into its GPU buffers, as the target.
  const draftReads = log.filter((entry) => entry.path === `/draft/${expected.model_file}`);
  assert.ok(draftReads.length > 0, JSON.stringify(log));
  assert.deepEqual(draftReads.filter((entry) => entry.status !== 206), [], 'every draft request is a range request');

  // Plain greedy on WebGPU: the CPU's tokens (every step decisive).
  assert.deepEqual(result.plain.hearth.prompt_token_ids, expected.prompt_tokens);
  assert.deepEqual(result.plain.hearth.token_ids, expected.tokens);
  assert.equal(result.plain.usage.speculative, undefined);

  for (const [name, spec] of [['draft-model', result.drafted], ['lookup', result.lookup], ['lookup then draft-model', result.both]]) {
    assert.deepEqual(spec.hearth.token_ids, expected.tokens, name);
    assert.equal(spec.choices[0].text, result.plain.choices[0].text, name);
    assert.equal(spec.choices[0].finish_reason, 'length', name);
    const metrics = spec.usage.speculative;
    process.stderr.write(`WebGPU ${name}: ${JSON.stringify(metrics)}, decode ${spec.usage.decode_tok_s.toFixed(2)} tok/s (plain ${result.plain.usage.decode_tok_s.toFixed(2)})\n`);
    assert.ok(metrics.proposed > 0 && metrics.accepted > 0, `${name}: ${JSON.stringify(metrics)}`);
    assert.ok(metrics.accepted <= metrics.proposed, `${name}: ${JSON.stringify(metrics)}`);
    // Each pass yields its accepted drafts plus one token of the target's; the first comes from the prompt.
    assert.equal(1 + metrics.accepted + metrics.target_forward_passes, expected.tokens.length, `${name}: ${JSON.stringify(metrics)}`);
  }
  // The lookup's share is counted apart (and only in the combined mode).
  assert.equal(result.lookup.usage.speculative.free_passes, 0);
  const both = result.both.usage.speculative;
  assert.ok(both.free_proposed <= both.proposed && both.free_passes <= both.target_forward_passes, JSON.stringify(both));
  // The model drafting for itself on the same kernels: every draft is accepted.
  const drafted = result.drafted.usage.speculative;
  assert.equal(drafted.accepted, drafted.proposed, JSON.stringify(drafted));
});

test("a draft on the wasm CPU engine drafting for a WebGPU target keeps the greedy tokens", { timeout: 1_800_000 }, async () => {
  const result = await page.evaluate(async ({ modelUrl, draftUrl, prompt, maxTokens }) => {
    const { createEngine } = await import('/dist/index.js');
    const engine = await createEngine({ model: modelUrl, draftModel: draftUrl, backend: 'webgpu', draftBackend: 'cpu', worker: true, cache: false });
    const drafted = await engine.completions.create({ prompt, temperature: 0, max_tokens: maxTokens, ignore_eos: true, speculative: { mode: 'draft-model', draftTokens: 3, draftMinP: 0, fixedLength: true } });
    const stats = await engine.runtimeStats();
    await engine.unload();
    return { drafted, stats };
  }, { modelUrl: `/models/${expected.model_file}`, draftUrl: `/draft/${expected.model_file}`, prompt: expected.prompt, maxTokens: expected.tokens.length });
  assert.equal(result.stats.backend, 'webgpu', JSON.stringify(result.stats));
  assert.equal(result.stats.draft?.backend, 'cpu-wasm', JSON.stringify(result.stats.draft));
  assert.equal(result.stats.draft.adapter, null);
  assert.deepEqual(result.drafted.hearth.token_ids, expected.tokens);
  const metrics = result.drafted.usage.speculative;
  process.stderr.write(`WebGPU target, wasm CPU draft: ${JSON.stringify(metrics)}\n`);
  // The CPU's drafts are its greedy tokens, which the GPU target takes at every (decisive) step.
  assert.ok(metrics.accepted > 0 && metrics.accepted <= metrics.proposed, JSON.stringify(metrics));
  assert.equal(1 + metrics.accepted + metrics.target_forward_passes, expected.tokens.length, JSON.stringify(metrics));
  assert.equal(metrics.acceptance_rate, metrics.accepted / metrics.proposed);
});

test('structured output on WebGPU: a choice holds', { timeout: 1_800_000 }, async () => {
  const choices = ['Paris', 'Lyon', 'Marseille'];
  const result = await page.evaluate(async ({ modelUrl, prompt, choices }) => {
    const { createEngine } = await import('/dist/index.js');
    const engine = await createEngine({ model: modelUrl, backend: 'webgpu', worker: true, cache: false });
    const reply = await engine.completions.create({ prompt, temperature: 0, max_tokens: 16, structured_outputs: { choice: choices } });
    const stats = await engine.runtimeStats();
    await engine.unload();
    return { text: reply.choices[0].text, finish: reply.choices[0].finish_reason, stats };
  }, { modelUrl: `/models/${expected.model_file}`, prompt: expected.prompt, choices });
  assert.equal(result.stats.backend, 'webgpu', JSON.stringify(result.stats));
  assert.ok(choices.includes(result.text), JSON.stringify(result.text));
  assert.equal(result.finish, 'stop');
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
      for await (const chunk of await engine.completions.create({ prompt, stream: true, temperature: 0, max_tokens: 6, ignore_eos: true })) {
        if (!destroyed && chunk.choices[0].text) destroyed = await engine._loseDeviceForTest();
      }
    } catch (e) {
      error = describe(e);
    }
    // The device stays lost: the next request fails the same way.
    const next = await engine.completions.create({ prompt, max_tokens: 1 }).then(() => null, describe);
    await engine.unload().catch(() => {});
    const reloaded = await createEngine({ model: modelUrl, backend: 'webgpu', worker: true, cache: false });
    const after = await reloaded.completions.create({ prompt, temperature: 0, max_tokens: 2, ignore_eos: true });
    const stats = await reloaded.runtimeStats();
    await reloaded.unload();
    return { destroyed, error, next, tokens: after.hearth.token_ids, stats };
  }, { modelUrl: `/models/${expected.model_file}`, prompt: expected.prompt });
  assert.equal(result.destroyed, true);
  assert.equal(result.error?.name, 'HearthError', JSON.stringify(result));
  assert.equal(result.error.code, 'device-lost', JSON.stringify(result));
  assert.match(result.error.message, /GPU device was lost/);
  assert.equal(result.next?.code, 'device-lost', JSON.stringify(result));
  assert.deepEqual(result.tokens, expected.tokens.slice(0, 2));
  assert.equal(result.stats.backend, 'webgpu');
});
