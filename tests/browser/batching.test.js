// Concurrent requests and speculative decoding through the built hearth-llm package in headless
// Chromium (Gemma 3 270M on the WebAssembly CPU engine, worker mode):
// - concurrent requests run as one continuous batch (runtimeStats().batch.max_batch_observed > 1)
//   and each gives the greedy tokens it gives alone (the first prompt: the native CPU fixture);
// - aborting one request of a batch ends it with 'abort' and frees its KV blocks, the others go on;
// - `n` choices of one prompt are the answers of n requests seeded in turn, streamed or not, and
//   share the prompt's KV blocks;
// - completions' `echo`: each choice's text and log-probabilities start with the prompt's, and a
//   stream sends the prompt as each choice's first chunk;
// - speculative decoding (prompt lookup, draft model) keeps the greedy output and reports its
//   acceptance; a draft model of another vocabulary is a clear HearthError.
//
// Needs what gemma.test.js needs (scripts/build-web.sh, playwright-core, Chromium, the model).

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
const MAX_TOKENS = 12;
// Different lengths, so that prompts and decodes share forward passes.
const PROMPTS = [expected.prompt, 'The capital of France is', 'Here is a list of prime numbers: 2, 3, 5, 7, 11,'];

let server, origin, browser, page;

before(async () => {
  assert.ok(existsSync(join(dist, 'index.js')), 'web/hearth-llm/dist is missing: run scripts/build-web.sh');
  assert.ok(existsSync(join(modelsDir, expected.model_file)), `${expected.model_file} is missing from ${modelsDir}`);
  ({ server, origin } = await serve({
    '/dist/': dist,
    '/models/': modelsDir,
    '/synthetic/': join(root, 'tests/fixtures/synthetic'),
    '/': dirname(fileURLToPath(import.meta.url)),
  }));
  browser = await launchChromium();
  page = await openTestPage(browser, origin);
});

after(async () => {
  await browser?.close();
  server?.close();
});

test('concurrent requests are batched and each gives its solo greedy tokens', { timeout: 600_000 }, async () => {
  const result = await page.evaluate(async ({ modelUrl, prompts, maxTokens }) => {
    const { createEngine } = await import('/dist/index.js');
    const engine = await createEngine({ model: modelUrl, backend: 'cpu', worker: true, cache: false });
    window.engine = engine;
    const request = (prompt) => engine.completions.create({ prompt, temperature: 0, max_tokens: maxTokens });
    const solo = [];
    for (const prompt of prompts) solo.push(await request(prompt));
    const afterSolo = (await engine.runtimeStats()).batch;
    const together = await Promise.all(prompts.map(request));
    const afterTogether = (await engine.runtimeStats()).batch;
    return { solo, together, afterSolo, afterTogether };
  }, { modelUrl: `/models/${expected.model_file}`, prompts: PROMPTS, maxTokens: MAX_TOKENS });

  assert.deepEqual(result.solo[0].hearth.token_ids, expected.tokens.slice(0, MAX_TOKENS));
  for (let i = 0; i < PROMPTS.length; i++) {
    assert.deepEqual(result.together[i].hearth.token_ids, result.solo[i].hearth.token_ids, `prompt ${i}`);
    assert.equal(result.together[i].choices[0].text, result.solo[i].choices[0].text, `prompt ${i}`);
    assert.equal(result.together[i].choices[0].finish_reason, 'length');
  }
  // Alone, one request per forward pass; together, several.
  assert.equal(result.afterSolo.max_batch_observed, 1, JSON.stringify(result.afterSolo));
  assert.ok(result.afterTogether.max_batch_observed > 1, JSON.stringify(result.afterTogether));
  assert.equal(result.afterTogether.running, 0);
  assert.equal(result.afterTogether.kv_blocks_used, 0);
  process.stderr.write(`batch stats: ${JSON.stringify(result.afterTogether)}\n`);
});

test('aborting one request of a batch frees its blocks; the others finish unchanged', { timeout: 600_000 }, async () => {
  const result = await page.evaluate(async ({ prompts }) => {
    const engine = window.engine;
    const controller = new AbortController();
    const long = { prompt: prompts[1], temperature: 0, max_tokens: 64, ignore_eos: true, stream: true, signal: controller.signal };
    const kept = engine.completions.create({ prompt: prompts[0], temperature: 0, max_tokens: 24 });
    const aborted = (async () => {
      const chunks = [];
      for await (const chunk of await engine.completions.create(long)) {
        chunks.push(chunk);
        if (chunks.length === 3) controller.abort();
      }
      return chunks.at(-1);
    })();
    const [keptResult, abortedLast] = await Promise.all([kept, aborted]);
    const alone = await engine.completions.create({ prompt: prompts[0], temperature: 0, max_tokens: 24 });
    const stats = (await engine.runtimeStats()).batch;
    return { keptResult, abortedLast, alone, stats };
  }, { prompts: PROMPTS });
  assert.equal(result.abortedLast.choices[0].finish_reason, 'abort');
  assert.deepEqual(result.keptResult.hearth.token_ids, result.alone.hearth.token_ids);
  assert.equal(result.keptResult.choices[0].finish_reason, 'length');
  assert.equal(result.stats.running, 0);
  assert.equal(result.stats.waiting, 0);
  // Every block held by a live sequence was released (a leaked sequence would keep its blocks).
  assert.equal(result.stats.kv_blocks_used, 0, JSON.stringify(result.stats));
});

test('n choices are the answers of n requests seeded in turn, streamed or not, and share the prompt', { timeout: 600_000 }, async () => {
  const result = await page.evaluate(async ({ prompts }) => {
    const engine = window.engine;
    const sampled = { prompt: prompts[2], temperature: 1, top_k: 40, max_tokens: 8, ignore_eos: true };
    const together = await engine.completions.create({ ...sampled, seed: 11, n: 3 });
    const apart = [];
    for (const seed of [11, 12, 13]) apart.push(await engine.completions.create({ ...sampled, seed }));
    const streamedRequest = { prompt: prompts[1], temperature: 1, max_tokens: 6, ignore_eos: true };
    const streamed = { texts: ['', '', ''], finishes: [], lastUsage: null };
    for await (const chunk of await engine.completions.create({ ...streamedRequest, seed: 5, n: 3, stream: true })) {
      const [choice] = chunk.choices;
      streamed.texts[choice.index] += choice.text;
      if (choice.finish_reason) streamed.finishes.push([choice.index, choice.finish_reason]);
      if (chunk.usage) streamed.lastUsage = chunk.usage;
    }
    const streamedApart = [];
    for (const seed of [5, 6, 7]) streamedApart.push(await engine.completions.create({ ...streamedRequest, seed }));
    const stats = (await engine.runtimeStats()).batch;
    return { together, apart, streamed, streamedApart, stats };
  }, { prompts: PROMPTS });
  const { together, apart, streamed, streamedApart, stats } = result;
  assert.equal(together.choices.length, 3);
  for (let i = 0; i < 3; i++) {
    assert.equal(together.choices[i].index, i);
    assert.equal(together.choices[i].text, apart[i].choices[0].text, `choice ${i}`);
    assert.deepEqual(together.hearth.choices[i], { token_ids: apart[i].hearth.token_ids, seed: 11 + i }, `choice ${i}`);
    assert.equal(streamed.texts[i], streamedApart[i].choices[0].text, `streamed choice ${i}`);
  }
  // The choices differ (sampled), or the check above would not tell them apart.
  assert.ok(new Set(together.choices.map((c) => c.text)).size > 1, JSON.stringify(together.choices));
  // The prompt counted once, the choices' tokens summed.
  assert.equal(together.usage.prompt_tokens, apart[0].usage.prompt_tokens);
  assert.equal(together.usage.completion_tokens, 24);
  assert.deepEqual(streamed.finishes, [[0, 'length'], [1, 'length'], [2, 'length']]);
  assert.equal(streamed.lastUsage.completion_tokens, 18);
  assert.equal(stats.running, 0);
  assert.equal(stats.kv_blocks_used, 0, JSON.stringify(stats));
});

test('echo starts each choice with the prompt, its log-probabilities first, streamed first', { timeout: 600_000 }, async () => {
  const result = await page.evaluate(async ({ prompts }) => {
    const engine = window.engine;
    const request = { prompt: prompts[1], temperature: 0, max_tokens: 5, ignore_eos: true };
    const plain = await engine.completions.create(request);
    const echoed = await engine.completions.create({ ...request, echo: true, logprobs: 1, n: 2 });
    const firstChunks = [null, null];
    const texts = ['', ''];
    for await (const chunk of await engine.completions.create({ ...request, echo: true, n: 2, stream: true })) {
      const [choice] = chunk.choices;
      firstChunks[choice.index] ??= choice.text;
      texts[choice.index] += choice.text;
    }
    return { plain, echoed, firstChunks, texts };
  }, { prompts: PROMPTS });
  const { plain, echoed, firstChunks, texts } = result;
  const prompt = PROMPTS[1];
  const want = prompt + plain.choices[0].text;
  for (const i of [0, 1]) {
    const choice = echoed.choices[i];
    assert.equal(choice.text, want, `choice ${i}`);
    // One entry per prompt token (the first null: nothing predicts it), then one per answer token.
    const { tokens, token_logprobs } = choice.logprobs;
    assert.equal(tokens.length, echoed.usage.prompt_tokens + 5, JSON.stringify(choice.logprobs));
    // (Gemma's prompt starts with its BOS token, which the prompt's text does not spell.)
    assert.equal(tokens.join(''), `<bos>${want}`);
    assert.equal(token_logprobs[0], null);
    assert.ok(token_logprobs.slice(1).every((l) => typeof l === 'number' && l <= 0), JSON.stringify(token_logprobs));
    assert.equal(firstChunks[i], prompt, `streamed choice ${i}`);
    assert.equal(texts[i], want, `streamed choice ${i}`);
  }
  assert.deepEqual(echoed.choices[1].logprobs.token_logprobs.slice(0, echoed.usage.prompt_tokens), echoed.choices[0].logprobs.token_logprobs.slice(0, echoed.usage.prompt_tokens));
});

test('speculative decoding by prompt lookup keeps the greedy output and reports acceptance', { timeout: 600_000 }, async () => {
  const result = await page.evaluate(async ({ prompts }) => {
    const engine = window.engine;
    // Repetitive text, so that lookup finds drafts.
    const repetitive = 'red green blue red green blue red green blue red green blue red';
    const out = {};
    for (const [name, prompt] of [['fixture', prompts[0]], ['repetitive', repetitive]]) {
      const plain = await engine.completions.create({ prompt, temperature: 0, max_tokens: 16, ignore_eos: true });
      const lookup = await engine.completions.create({ prompt, temperature: 0, max_tokens: 16, ignore_eos: true, speculative: { mode: 'lookup', draftTokens: 4, fixedLength: true } });
      out[name] = { plain, lookup };
    }
    const badMode = await engine.completions.create({ prompt: 'x', speculative: { mode: 'guess' } }).then(() => 'no error', (e) => `${e.name} ${e.code}: ${e.message}`);
    const noDraft = await engine.completions.create({ prompt: 'x', max_tokens: 2, speculative: { mode: 'draft-model' } }).then(() => 'no error', (e) => `${e.name} ${e.code}: ${e.message}`);
    return { ...out, badMode, noDraft };
  }, { prompts: PROMPTS });
  assert.deepEqual(result.fixture.lookup.hearth.token_ids, expected.tokens);
  for (const name of ['fixture', 'repetitive']) {
    const { plain, lookup } = result[name];
    assert.deepEqual(lookup.hearth.token_ids, plain.hearth.token_ids, name);
    assert.equal(lookup.choices[0].text, plain.choices[0].text, name);
    assert.equal(plain.usage.speculative, undefined);
    assert.ok(lookup.usage.speculative.target_forward_passes > 0, JSON.stringify(lookup.usage));
  }
  const spec = result.repetitive.lookup.usage.speculative;
  assert.ok(spec.proposed > 0 && spec.accepted > 0, JSON.stringify(spec));
  assert.equal(spec.acceptance_rate, spec.accepted / spec.proposed);
  // Accepted drafts save target passes: without them every token after the first costs one.
  assert.ok(spec.target_forward_passes < result.repetitive.lookup.usage.completion_tokens - 1, JSON.stringify(result.repetitive.lookup.usage));
  process.stderr.write(`lookup on repetitive text: ${JSON.stringify(spec)}\n`);
  assert.match(result.badMode, /^HearthError bad-argument: .*speculative\.mode/);
  assert.match(result.noDraft, /^HearthError bad-argument: .*draft model/);
});

test('speculative decoding with a draft model keeps the greedy output; another vocabulary is refused', { timeout: 600_000 }, async () => {
  const result = await page.evaluate(async ({ modelUrl, prompt }) => {
    const { createEngine } = await import('/dist/index.js');
    // Gemma drafting for itself: the same vocabulary, and its drafts are the target's greedy tokens.
    const engine = await createEngine({ model: modelUrl, draftModel: modelUrl, backend: 'cpu', worker: true, cache: false });
    const drafted = await engine.completions.create({ prompt, temperature: 0, max_tokens: 16, speculative: { mode: 'draft-model', draftTokens: 3, fixedLength: true } });
    const stats = await engine.runtimeStats();
    await engine.unload();
    // A synthetic llama model with its own small vocabulary.
    const mismatch = await createEngine({ model: modelUrl, draftModel: '/synthetic/llama-gqa-q8_0.gguf', backend: 'cpu', worker: true, cache: false })
      .then(() => 'no error', (e) => `${e.name} ${e.code}: ${e.message}`);
    return { drafted, stats, mismatch };
  }, { modelUrl: `/models/${expected.model_file}`, prompt: expected.prompt });
  assert.equal(result.stats.draft_model, true);
  assert.deepEqual(result.drafted.hearth.token_ids, expected.tokens);
  const spec = result.drafted.usage.speculative;
  // The same model greedy-drafts what it then verifies (up to near-ties between its one-token
  // draft steps and the multi-token verification pass).
  assert.ok(spec.proposed > 0 && spec.accepted > 0, JSON.stringify(spec));
  process.stderr.write(`self-drafting Gemma: ${JSON.stringify(spec)}\n`);
  assert.match(result.mismatch, /^HearthError bad-argument: .*draft model.*cannot draft for this model/);
});
