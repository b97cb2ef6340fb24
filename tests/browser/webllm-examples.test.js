// WebLLM's own examples (mlc-ai/web-llm's examples/, Apache-2.0, copied unchanged into
// tests/fixtures/webllm-examples) run on hearth-llm/webllm in headless Chromium, migrated as an app
// would be: the "@mlc-ai/web-llm" import names hearth-llm/webllm, and each MLC model id (and the
// MLC weights URL of text-completion's own appConfig record) names a GGUF model. The rest is what
// a bundler does (TypeScript to JavaScript, bare imports to files). Each page runs as written; the
// test reads what it logs and shows and checks what must hold for any sampled answer (the
// examples sample at their temperatures): JSON answers parse and match their schema, tool calls'
// arguments match the tool's parameters, seeded answers repeat (seed-to-reproduce throws
// otherwise), a second round prefills fewer tokens (multi-round-chat throws otherwise), usage has
// WebLLM's `extra` timings, and no page throws.
//
// Chromium runs without WebGPU, so the engine takes the wasm CPU path (the WebGPU path is
// webgpu.test.js's). Needs what qwen.test.js needs, and `npm install` (typescript, typebox,
// loglevel).

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync, copyFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { homedir, tmpdir } from 'node:os';
import { chromium } from 'playwright-core';
import { serve } from './server.js';

const root = join(dirname(fileURLToPath(import.meta.url)), '../..');
const dist = join(root, 'web/hearth-llm/dist');
const fixtures = join(root, 'tests/fixtures/webllm-examples');
const modelsDir = process.env.HEARTH_MODELS_DIR ?? join(homedir(), '.cache/hearth/models');
const MODEL_FILE = 'qwen2.5-coder-0.5b-instruct-q4_k_m.gguf';
const MODEL_URL = `/models/${MODEL_FILE}`;
const TIMEOUT_MS = 420_000;

let server, origin, browser, context, built;

/** The examples as a bundler would serve them: JavaScript, with imports resolved to files. */
function buildExamples() {
  const out = mkdtempSync(join(tmpdir(), 'hearth-webllm-examples-'));
  const examples = readdirSync(fixtures, { withFileTypes: true }).filter((entry) => entry.isDirectory()).map((entry) => entry.name);
  const sources = examples.flatMap((name) => readdirSync(join(fixtures, name)).filter((file) => file.endsWith('.ts')).map((file) => join(fixtures, name, file)));
  execFileSync(join(root, 'node_modules/.bin/tsc'), ['--outDir', out, '--rootDir', fixtures, '--target', 'es2022', '--module', 'esnext', '--moduleResolution', 'bundler', '--noCheck', '--skipLibCheck', ...sources], { stdio: 'inherit' });
  for (const name of examples) {
    mkdirSync(join(out, name), { recursive: true });
    for (const file of readdirSync(join(fixtures, name))) {
      if (!file.endsWith('.ts')) copyFileSync(join(fixtures, name, file), join(out, name, file));
    }
    for (const file of readdirSync(join(out, name))) {
      const path = join(out, name, file);
      let text = readFileSync(path, 'utf8');
      if (file.endsWith('.html')) {
        text = text.replace(/src="\.\/([\w-]+)\.ts"/g, 'src="./$1.js"');
      } else {
        text = text
          // The migration: the import and the model ids.
          .replaceAll('"@mlc-ai/web-llm"', '"/dist/webllm.js"')
          .replace(/"https:\/\/huggingface\.co\/mlc-ai\/[\w.-]+-MLC"/g, JSON.stringify(MODEL_URL))
          .replace(/"[\w.-]+-MLC"/g, JSON.stringify(MODEL_URL))
          // The bundler's part.
          .replaceAll('"@sinclair/typebox"', '"/npm/@sinclair/typebox/build/esm/index.mjs"')
          .replaceAll('"loglevel"', '"/shim/loglevel.js"')
          .replaceAll('"./worker.ts"', '"./worker.js"');
      }
      writeFileSync(path, text);
    }
  }
  // loglevel is CommonJS/UMD: wrapped as a module, as a bundler would.
  const shim = join(out, '_shim');
  mkdirSync(shim);
  const umd = readFileSync(join(root, 'node_modules/loglevel/lib/loglevel.js'), 'utf8');
  writeFileSync(join(shim, 'loglevel.js'), `const module = { exports: {} };\n(function (module) {\n${umd}\n})(module);\nexport default module.exports;\nexport const { trace, debug, info, warn, error, setLevel, getLogger } = module.exports;\n`);
  return out;
}

before(async () => {
  assert.ok(existsSync(join(dist, 'webllm.js')), 'web/hearth-llm/dist is missing: run scripts/build-web.sh');
  assert.ok(existsSync(join(modelsDir, MODEL_FILE)), `${MODEL_FILE} is missing from ${modelsDir} (hearth models fetch qwen2.5-coder-0.5b)`);
  built = buildExamples();
  ({ server, origin } = await serve({
    '/dist/': dist,
    '/models/': modelsDir,
    '/npm/': join(root, 'node_modules'),
    '/shim/': join(built, '_shim'),
    '/examples/': built,
  }));
  browser = await chromium.launch({
    executablePath: process.env.HEARTH_CHROMIUM ?? '/usr/bin/chromium',
    args: ['--no-sandbox', '--disable-background-networking', '--headless=new'],
  });
  // One context: the first example caches the model in OPFS, the others read it from there.
  context = await browser.newContext();
});

after(async () => {
  await browser?.close();
  server?.close();
  if (built) rmSync(built, { recursive: true, force: true });
});

/** Opens an example page and collects its console output (each message's arguments as values)
 * until `done(logs)`; fails on the first uncaught error. */
async function runExample(path, done) {
  const page = await context.newPage();
  const logs = [];
  let failure = null;
  page.on('pageerror', (error) => (failure ??= error));
  page.on('console', async (message) => {
    const entry = { type: message.type(), text: message.text(), values: null, at: Date.now() };
    logs.push(entry);
    try {
      entry.values = await Promise.all(message.args().map((arg) => arg.jsonValue()));
    } catch {
      entry.values = [];
    }
    if (message.type() === 'error') process.stderr.write(`[${path}] ${message.text()}\n`);
  });
  await page.goto(`${origin}/examples/${path}`);
  const deadline = Date.now() + TIMEOUT_MS;
  while (!failure && !done(logs)) {
    assert.ok(Date.now() < deadline, `${path} did not finish in ${TIMEOUT_MS / 1000} s; it logged:\n${logs.map((l) => l.text).join('\n')}`);
    await new Promise((resolve) => setTimeout(resolve, 250));
  }
  // Let the values of the last messages arrive.
  await new Promise((resolve) => setTimeout(resolve, 500));
  if (failure) throw new Error(`${path} threw: ${failure.stack ?? failure}\nit logged:\n${logs.map((l) => l.text).join('\n')}`);
  const label = async (id) => page.evaluate((id) => document.getElementById(id)?.innerText ?? null, id);
  const labels = { init: await label('init-label'), generate: await label('generate-label') };
  await page.close();
  return { logs, labels };
}

const values = (logs) => logs.flatMap((log) => log.values ?? []);
const replies = (logs) => values(logs).filter((v) => v && typeof v === 'object' && Array.isArray(v.choices) && v.object?.endsWith('completion'));
const usages = (logs) => values(logs).filter((v) => v && typeof v === 'object' && typeof v.total_tokens === 'number');
const chunks = (logs) => values(logs).filter((v) => v && typeof v === 'object' && v.object === 'chat.completion.chunk');
const logged = (logs, prefix) => logs.find((log) => log.text.startsWith(prefix));

function checkExtra(usage) {
  for (const field of ['e2e_latency_s', 'prefill_tokens_per_s', 'decode_tokens_per_s', 'time_to_first_token_s', 'time_per_output_token_s']) {
    assert.ok(Number.isFinite(usage.extra?.[field]) && usage.extra[field] >= 0, `usage.extra.${field}: ${JSON.stringify(usage)}`);
  }
  assert.ok(usage.extra.decode_tokens_per_s > 0 && usage.extra.e2e_latency_s > 0, JSON.stringify(usage));
}

const loadedOnTheCpu = (labels) => assert.match(labels.init, /^Finish loading on CPU \(WebAssembly\)/);

test('get-started: n = 3 answers with logit_bias and top log-probabilities, usage.extra', { timeout: TIMEOUT_MS }, async () => {
  const { logs, labels } = await runExample('get-started/get_started.html', (l) => usages(l).length >= 1);
  loadedOnTheCpu(labels);
  const [reply] = replies(logs);
  assert.equal(reply.choices.length, 3);
  for (const choice of reply.choices) {
    assert.equal(typeof choice.message.content, 'string');
    assert.ok(['stop', 'length'].includes(choice.finish_reason));
    assert.ok(choice.logprobs.content.length > 0 && choice.logprobs.content.every((t) => t.top_logprobs.length === 2));
  }
  checkExtra(usages(logs)[0]);
});

test('get-started-web-worker: a streamed answer from an engine in the page\'s own worker', { timeout: TIMEOUT_MS }, async () => {
  const { logs, labels } = await runExample('get-started-web-worker/get_started.html', (l) => Boolean(logged(l, 'Final message')));
  loadedOnTheCpu(labels);
  const final = logged(logs, 'Final message').values[1];
  assert.ok(final.length > 0);
  const words = (text) => text.split(/\s+/).filter(Boolean).join(' ');
  assert.equal(words(labels.generate), words(final), 'the label shows the streamed text');
  assert.equal(chunks(logs).map((c) => c.choices[0]?.delta?.content ?? '').join(''), final);
  // include_usage: the usage comes last, in a chunk of no choices.
  const last = chunks(logs).at(-1);
  assert.deepEqual(last.choices, []);
  checkExtra(last.usage);
});

test('streaming: deltas with log-probabilities, then the usage chunk', { timeout: TIMEOUT_MS }, async () => {
  const { logs } = await runExample('streaming/streaming.html', (l) => Boolean(logged(l, 'Final message')));
  const streamed = chunks(logs);
  const final = logged(logs, 'Final message').values[1];
  assert.equal(streamed.map((c) => c.choices[0]?.delta?.content ?? '').join(''), final);
  const finish = streamed.find((c) => c.choices[0]?.finish_reason);
  assert.ok(finish.choices[0].logprobs.content.length > 0, 'logprobs: true streams the answer\'s log-probabilities');
  checkExtra(streamed.at(-1).usage);
});

test('multi-round-chat: the second round prefills only what the first did not', { timeout: TIMEOUT_MS }, async () => {
  const { logs } = await runExample('multi-round-chat/multi_round_chat.html', (l) => Boolean(logged(l, 'Requset 1 prompt tokens')));
  const [first, second] = usages(logs);
  assert.ok(second.prompt_tokens < first.prompt_tokens, `round 1 prefilled ${second.prompt_tokens} tokens, round 0 ${first.prompt_tokens}`);
});

test('abort-reload: unload() during reload() stops the load without an error', { timeout: TIMEOUT_MS }, async () => {
  const { logs } = await runExample('abort-reload/get_started.html', (l) => {
    const unload = logged(l, 'calling unload');
    return unload && Date.now() - unload.at > 3000;
  });
  assert.ok(logged(logs, 'calling unload'));
  assert.ok(!logs.some((log) => log.type === 'error'), 'nothing logged an error');
});

test('json-mode: every finished answer is JSON', { timeout: TIMEOUT_MS }, async () => {
  const { logs } = await runExample('json-mode/json_mode.html', (l) => usages(l).length >= 1);
  const [reply] = replies(logs);
  assert.equal(reply.choices.length, 2);
  for (const choice of reply.choices) {
    if (choice.finish_reason === 'stop') assert.doesNotThrow(() => JSON.parse(choice.message.content), choice.message.content);
  }
  assert.equal(logged(logs, "First reply's last choice:").text, `First reply's last choice:\n${reply.choices[1].message.content}`, 'getMessage() is the last choice');
  const usage = usages(logs)[0];
  checkExtra(usage);
  assert.ok(usage.extra.grammar_per_token_s > 0 && usage.extra.grammar_init_s >= 0, JSON.stringify(usage.extra));
});

test('json-schema: the answer matches the typebox schema', { timeout: TIMEOUT_MS }, async () => {
  const { logs } = await runExample('json-schema/json_schema.html', (l) => values(l).some((v) => v && typeof v.e2e_latency_s === 'number'));
  const schema = JSON.parse(logs.find((log) => log.text.startsWith('{"')).text);
  const [reply] = replies(logs);
  const choice = reply.choices[0];
  if (choice.finish_reason === 'stop') {
    const answer = JSON.parse(choice.message.content);
    assert.deepEqual(Object.keys(answer).sort(), Object.keys(schema.properties).sort());
    for (const field of ['house', 'blood_status', 'occupation']) {
      assert.ok(schema.properties[field].anyOf.some((option) => option.const === answer[field]), `${field}: ${answer[field]}`);
    }
    assert.equal(typeof answer.alive, 'boolean');
    assert.equal(typeof answer.wand.length, 'number');
  } else {
    assert.equal(choice.finish_reason, 'length');
  }
});

test('function-calling-openai: streamed tool calls with arguments valid for the tool', { timeout: TIMEOUT_MS }, async () => {
  const { logs } = await runExample('function-calling-openai/function_calling_openai.html', (l) => chunks(l).some((c) => c.usage));
  const streamed = chunks(logs);
  const finish = streamed.find((c) => c.choices[0]?.finish_reason).choices[0].finish_reason;
  const calls = new Map();
  for (const chunk of streamed) {
    for (const delta of chunk.choices[0]?.delta?.tool_calls ?? []) {
      const call = calls.get(delta.index) ?? { name: '', arguments: '' };
      call.name += delta.function?.name ?? '';
      call.arguments += delta.function?.arguments ?? '';
      calls.set(delta.index, call);
    }
  }
  process.stderr.write(`function-calling-openai: finish_reason ${finish}, calls ${JSON.stringify([...calls.values()])}, text ${JSON.stringify(streamed.map((c) => c.choices[0]?.delta?.content ?? "").join(""))}\n`);
  if (finish === 'tool_calls') {
    assert.ok(calls.size > 0);
    for (const call of calls.values()) {
      assert.equal(call.name, 'get_current_weather');
      const args = JSON.parse(call.arguments);
      assert.equal(typeof args.location, 'string');
      if ('unit' in args) assert.ok(['celsius', 'fahrenheit'].includes(args.unit));
    }
  } else {
    assert.equal(calls.size, 0, 'calls end the answer with finish_reason tool_calls');
  }
});

test('function-calling-manual: four rounds with tool results sent back', { timeout: TIMEOUT_MS }, async () => {
  const { logs } = await runExample('function-calling-manual/function_calling_manual.html', (l) => Boolean(logged(l, 'Response 4:')));
  assert.equal(usages(logs).length, 4);
});

test('seed-to-reproduce: the same seed gives the same three answers', { timeout: TIMEOUT_MS }, async () => {
  const { logs } = await runExample('seed-to-reproduce/seed.html', (l) => usages(l).length >= 2);
  const [first, second] = replies(logs);
  assert.deepEqual(second.choices.map((c) => c.message.content), first.choices.map((c) => c.message.content));
  assert.notEqual(first.choices[0].message.content, first.choices[1].message.content, 'the choices are sampled with different seeds');
});

test('text-completion: echoed prompt, two choices, log-probabilities, its appConfig record', { timeout: TIMEOUT_MS }, async () => {
  const { logs } = await runExample('text-completion/text_completion.html', (l) => usages(l).length >= 1);
  const [reply] = replies(logs);
  assert.equal(reply.object, 'text_completion');
  assert.equal(reply.choices.length, 2);
  for (const choice of reply.choices) assert.ok(choice.text.startsWith('List 3 US states: '), choice.text);
});

test('an MLC-only model id fails with ModelNotFoundError naming what to do', { timeout: TIMEOUT_MS }, async () => {
  const page = await context.newPage();
  await page.goto(`${origin}/examples/`);
  const error = await page.evaluate(async () => {
    const webllm = await import('/dist/webllm.js');
    try {
      await webllm.CreateMLCEngine('Phi-3.5-vision-instruct-q4f16_1-MLC');
      return null;
    } catch (error) {
      return { name: error.name, code: error.code, message: error.message };
    }
  });
  await page.close();
  assert.equal(error?.name, 'ModelNotFoundError');
  assert.equal(error.code, 'bad-argument');
  assert.match(error.message, /Cannot find model record in appConfig for Phi-3\.5-vision-instruct-q4f16_1-MLC.*GGUF/);
});

test('unload() during reload(): reload returns without a model, and requests say none is loaded', { timeout: TIMEOUT_MS }, async () => {
  const page = await context.newPage();
  await page.goto(`${origin}/examples/`);
  const outcome = await page.evaluate(async (url) => {
    const webllm = await import('/dist/webllm.js');
    const engine = new webllm.MLCEngine();
    const reloading = engine.reload(url);
    await new Promise((resolve) => setTimeout(resolve, 50));
    await engine.unload();
    const reloaded = await reloading.then(() => 'returned', (error) => `threw ${error.name}: ${error.message}`);
    const request = await engine.chat.completions.create({ messages: [{ role: 'user', content: 'Hi' }] }).then(() => 'answered', (error) => error.name);
    return { reloaded, request };
  }, MODEL_URL);
  await page.close();
  assert.deepEqual(outcome, { reloaded: 'returned', request: 'ModelNotLoadedError' });
});
