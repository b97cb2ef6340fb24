// End to end in headless Chromium: the built hearth-llm package loads Qwen2.5-Coder-0.5B-Instruct
// (Q4_K_M: Q4_K, Q6_K, Q5_0 and Q8_0 tensors) on the wasm CPU engine and greedy-generates the same
// 16 tokens as the native CPU backend (fixture: tests/fixtures/browser/generate.sh); n choices,
// structured output and tool calls on the same engine. On WebGPU its kernels' tokens are checked
// natively against llama.cpp's (the conformance suite on lavapipe); in the browser, WebGPU runs
// SmolLM2 (webgpu.test.js), as SwiftShader takes minutes to load a model.
//
// Needs what gemma.test.js needs, plus the qwen2.5-coder-0.5b model in the cache.

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { homedir } from 'node:os';
import { launchChromium, openTestPage, serve, WEBGPU } from './server.js';

const root = join(dirname(fileURLToPath(import.meta.url)), '../..');
const dist = join(root, 'web/hearth-llm/dist');
const modelsDir = process.env.HEARTH_MODELS_DIR ?? join(homedir(), '.cache/hearth/models');
const expected = JSON.parse(readFileSync(join(root, 'tests/fixtures/browser/qwen05_quicksort_greedy.json'), 'utf8'));
const N_TOKENS = expected.tokens.length;

let server, origin, browser, page;
const requests = [];

before(async () => {
  assert.ok(existsSync(join(dist, 'index.js')), 'web/hearth-llm/dist is missing: run scripts/build-web.sh');
  assert.ok(existsSync(join(modelsDir, expected.model_file)), `${expected.model_file} is missing from ${modelsDir} (hearth models fetch qwen2.5-coder-0.5b)`);
  ({ server, origin } = await serve({ '/dist/': dist, '/models/': modelsDir, '/': dirname(fileURLToPath(import.meta.url)) }));
  browser = await launchChromium(WEBGPU);
  page = await openTestPage(browser, origin, (url) => requests.push(url));
});

after(async () => {
  await browser?.close();
  server?.close();
});

/** Loads the model on `backend` in the worker, streams `maxTokens` greedy tokens, unloads. */
async function generate(backend, maxTokens) {
  return page.evaluate(async ({ modelUrl, prompt, backend, maxTokens }) => {
    const { createEngine } = await import('/dist/index.js');
    const engine = await createEngine({ model: modelUrl, backend, worker: true, cache: false });
    const stream = await engine.completions.create({ prompt, stream: true, temperature: 0, max_tokens: maxTokens });
    const chunks = [];
    for await (const chunk of stream) chunks.push(chunk);
    const stats = await engine.runtimeStats();
    await engine.unload();
    return { chunks, stats };
  }, { modelUrl: `/models/${expected.model_file}`, prompt: expected.prompt, backend, maxTokens });
}

/** The native CPU's tokens, and their text. */
function assertSameAsNativeCpu(result, label) {
  const last = result.chunks.at(-1);
  process.stderr.write(`${label} token ids: ${JSON.stringify(last.hearth.token_ids)}\n`);
  assert.deepEqual(last.hearth.prompt_token_ids, expected.prompt_tokens);
  assert.deepEqual(last.hearth.token_ids, expected.tokens);
  assert.equal(result.chunks.map((c) => c.choices[0].text).join(''), expected.text);
  assert.equal(last.choices[0].finish_reason, 'length');
  process.stderr.write(`${label}: ttft ${last.usage.ttft_ms.toFixed(0)} ms, prefill ${last.usage.prefill_tok_s.toFixed(1)} tok/s, decode ${last.usage.decode_tok_s.toFixed(1)} tok/s\n`);
}

test("backend 'cpu' (wasm): Qwen 0.5B greedy tokens equal the native CPU backend", { timeout: 900_000 }, async () => {
  const result = await generate('cpu', N_TOKENS);
  assert.equal(result.stats.backend, 'cpu-wasm', JSON.stringify(result.stats));
  assertSameAsNativeCpu(result, 'wasm CPU');
});

test("chat with n choices: each choice's stream opens with the role and equals its choice in the whole answer", { timeout: 900_000 }, async () => {
  const result = await page.evaluate(async ({ modelUrl }) => {
    const { createEngine } = await import('/dist/index.js');
    const engine = await createEngine({ model: modelUrl, backend: 'cpu', worker: true, cache: false });
    const request = { messages: [{ role: 'user', content: 'Name a colour.' }], temperature: 1, max_tokens: 5, ignore_eos: true, seed: 3, n: 2 };
    const whole = await engine.chat.completions.create(request);
    const deltas = [];
    for await (const chunk of await engine.chat.completions.create({ ...request, stream: true })) deltas.push(chunk.choices[0]);
    await engine.unload();
    return { whole, deltas };
  }, { modelUrl: `/models/${expected.model_file}` });
  for (const index of [0, 1]) {
    const mine = result.deltas.filter((d) => d.index === index);
    assert.equal(mine[0].delta.role, 'assistant', JSON.stringify(mine[0]));
    assert.ok(mine.slice(1).every((d) => d.delta.role === undefined), JSON.stringify(mine));
    assert.equal(mine.map((d) => d.delta.content ?? '').join(''), result.whole.choices[index].message.content, `choice ${index}`);
    assert.equal(mine.at(-1).finish_reason, 'length');
  }
  assert.equal(result.whole.usage.completion_tokens, 10);
});

/** Constrained requests on `backend`: WebLLM's JSON mode with a schema as text, OpenAI's
 * json_schema streamed, and a choice; the answers parse and hold. */
async function structured(backend, requests) {
  return page.evaluate(async ({ modelUrl, backend, requests }) => {
    const { createEngine } = await import('/dist/index.js');
    const engine = await createEngine({ model: modelUrl, backend, worker: true, cache: false });
    const answers = [];
    for (const { stream, ...request } of requests) {
      if (stream) {
        let text = '';
        let finish = null;
        const calls = [];
        for await (const chunk of await engine.chat.completions.create({ ...request, stream: true })) {
          text += chunk.choices[0]?.delta?.content ?? '';
          finish = chunk.choices[0]?.finish_reason ?? finish;
          for (const call of chunk.choices[0]?.delta?.tool_calls ?? []) {
            if (call.id) calls[call.index] = { id: call.id, type: call.type, function: { name: call.function.name, arguments: '' } };
            calls[call.index].function.arguments += call.function.arguments;
          }
        }
        answers.push({ text, finish, calls });
      } else {
        const reply = await engine.chat.completions.create(request);
        const message = reply.choices[0].message;
        answers.push({ text: message.content, finish: reply.choices[0].finish_reason, usage: reply.usage, calls: message.tool_calls ?? [] });
      }
    }
    await engine.unload();
    return answers;
  }, { modelUrl: `/models/${expected.model_file}`, backend, requests });
}

const cityQuestion = [{ role: 'user', content: 'What is the capital of France?' }];
const citySchema = { type: 'object', properties: { city: { type: 'string', maxLength: 20 }, country: { enum: ['France', 'Italy'] } }, required: ['city', 'country'], additionalProperties: false };

test("structured output on the wasm CPU engine: JSON mode with a schema (WebLLM's shape), json_schema streamed, a grammar", { timeout: 900_000 }, async () => {
  const request = { messages: cityQuestion, temperature: 0, max_tokens: 40 };
  const [webllm, openai, streamed, grammar] = await structured('cpu', [
    { ...request, response_format: { type: 'json_object', schema: JSON.stringify(citySchema) } },
    { ...request, response_format: { type: 'json_schema', json_schema: { name: 'city', schema: citySchema } } },
    { ...request, stream: true, response_format: { type: 'json_schema', json_schema: { name: 'city', schema: citySchema } } },
    { ...request, response_format: { type: 'grammar', grammar: 'root ::= "The capital is " [A-Z] [a-z]+ "."' } },
  ]);
  for (const answer of [webllm, openai, streamed]) {
    const value = JSON.parse(answer.text);
    assert.deepEqual(Object.keys(value).sort(), ['city', 'country'], answer.text);
    assert.ok(['France', 'Italy'].includes(value.country), answer.text);
    assert.equal(answer.finish, 'stop');
  }
  assert.equal(streamed.text, openai.text);
  // One mask per token (forced tokens' rows are masked too), some tokens forced.
  assert.ok(openai.usage.grammar.masks >= openai.usage.completion_tokens, JSON.stringify(openai.usage));
  assert.ok(openai.usage.grammar.forced_tokens > 0, JSON.stringify(openai.usage));
  assert.match(grammar.text, /^The capital is [A-Z][a-z]+\.$/);
});

test("tool calls on the wasm CPU engine: required and named, streamed or not", { timeout: 900_000 }, async () => {
  const tools = [{ type: 'function', function: { name: 'get_weather', parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } }];
  const request = { messages: [{ role: 'user', content: 'What is the weather in Oslo?' }], tools, temperature: 0, max_tokens: 60, parallel_tool_calls: false };
  const [whole, streamed, named] = await structured('cpu', [
    { ...request, tool_choice: 'required' },
    { ...request, tool_choice: 'required', stream: true },
    { ...request, tool_choice: { type: 'function', function: { name: 'get_weather' } } },
  ]);
  for (const answer of [whole, streamed, named]) {
    assert.equal(answer.finish, 'tool_calls', JSON.stringify(answer));
    assert.equal(answer.calls.length, 1, JSON.stringify(answer));
    assert.equal(answer.calls[0].function.name, 'get_weather');
    assert.equal(typeof JSON.parse(answer.calls[0].function.arguments).city, 'string');
  }
  assert.equal(whole.text, null);
  assert.deepEqual(streamed.calls.map((c) => c.function), whole.calls.map((c) => c.function));
});

test('no request left the page origin', () => {
  const foreign = requests.filter((url) => !url.startsWith(origin));
  assert.deepEqual(foreign, []);
});
