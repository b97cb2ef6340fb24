#!/usr/bin/env node
// Structured output's cost in the browser: scripts/bench-constrained.sh's prompt and JSON Schema
// on hearth-llm's wasm CPU engine in headless Chromium (no WebGPU: SwiftShader would measure its
// emulation). Greedy; the constrained answer, then a free one of as many tokens (ignore_eos),
// alternating, `reps` pairs after a warm-up pair. Prints decode tok/s of both, their ratio (median
// of the paired ratios), the tokens the grammar forced and the wasm mask times (usage.grammar).
//
//   node scripts/bench-browser-constrained.mjs [--model qwen2.5-coder-0.5b-instruct-q4_k_m.gguf] [--reps 3]
// (build the package first: scripts/build-web.sh.) Not a test: it asserts nothing about speed.

import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { homedir, loadavg } from 'node:os';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';
import { serve } from '../tests/browser/server.js';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const arg = (name, fallback) => {
  const at = process.argv.indexOf(`--${name}`);
  return at > 0 ? process.argv[at + 1] : fallback;
};
const modelFile = arg('model', 'qwen2.5-coder-0.5b-instruct-q4_k_m.gguf');
const reps = Number(arg('reps', 3));
const modelsDir = process.env.HEARTH_MODELS_DIR ?? join(homedir(), '.cache/hearth/models');
const dist = join(root, 'web/hearth-llm/dist');
for (const path of [join(dist, 'index.js'), join(modelsDir, modelFile)]) {
  if (!existsSync(path)) {
    console.error(`bench-browser-constrained: missing ${path}`);
    process.exit(1);
  }
}

const SCHEMA = {
  type: 'object',
  properties: {
    languages: {
      type: 'array', minItems: 12, maxItems: 12,
      items: {
        type: 'object',
        properties: { name: { type: 'string', maxLength: 24 }, year: { type: 'integer' }, paradigm: { enum: ['functional', 'imperative', 'object-oriented', 'logic', 'multi-paradigm'] } },
        required: ['name', 'year', 'paradigm'], additionalProperties: false,
      },
    },
  },
  required: ['languages'], additionalProperties: false,
};
const PROMPT = 'List twelve programming languages with the year each appeared and its main paradigm, as JSON.';

const { server, origin } = await serve({ '/dist/': dist, '/models/': modelsDir, '/': join(root, 'tests/browser') });
const browser = await chromium.launch({ executablePath: process.env.HEARTH_CHROMIUM ?? '/usr/bin/chromium', args: ['--no-sandbox', '--disable-background-networking', '--headless=new'] });
try {
  const page = await browser.newPage();
  page.on('pageerror', (error) => process.stderr.write(`[page error] ${error}\n`));
  await page.goto(`${origin}/page.html`);
  const pairs = await page.evaluate(async ({ url, schema, prompt, reps }) => {
    const { createEngine } = await import('/dist/index.js');
    const engine = await createEngine({ model: url, backend: 'cpu', cache: false });
    const messages = [{ role: 'user', content: prompt }];
    const pairs = [];
    for (let rep = 0; rep <= reps; rep++) {
      const constrained = await engine.chat.completions.create({ messages, temperature: 0, max_tokens: 400, response_format: { type: 'json_schema', json_schema: { name: 'languages', schema, strict: true } } });
      const tokens = constrained.usage.completion_tokens;
      const free = await engine.chat.completions.create({ messages, temperature: 0, max_tokens: tokens, ignore_eos: true });
      if (rep > 0) pairs.push({ constrained: constrained.usage, free: free.usage, valid: (() => { try { return JSON.parse(constrained.choices[0].message.content).languages.length === 12; } catch { return false; } })() });
    }
    await engine.unload();
    return pairs;
  }, { url: `/models/${modelFile}`, schema: SCHEMA, prompt: PROMPT, reps });
  const median = (values) => [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)];
  const last = pairs.at(-1).constrained;
  console.log(`Chromium, hearth-llm wasm CPU engine, ${modelFile}, ${reps} pairs, load average ${loadavg()[0].toFixed(2)}`);
  console.log('| model | constrained tok/s | free tok/s | ratio | tokens | forced | mask p50 µs | mask p99 µs | valid |');
  console.log('|---|---|---|---|---|---|---|---|---|');
  console.log(`| ${modelFile.replace(/-instruct-q4_k_m\.gguf$/, '')} | ${median(pairs.map((p) => p.constrained.decode_tok_s)).toFixed(1)} | ${median(pairs.map((p) => p.free.decode_tok_s)).toFixed(1)} | ${median(pairs.map((p) => p.constrained.decode_tok_s / p.free.decode_tok_s)).toFixed(2)}x | ${last.completion_tokens} | ${last.grammar.forced_tokens} | ${last.grammar.mask_p50_us.toFixed(0)} | ${last.grammar.mask_p99_us.toFixed(0)} | ${pairs.filter((p) => p.valid).length}/${pairs.length} |`);
} finally {
  await browser.close();
  server.close();
}
