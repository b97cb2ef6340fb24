#!/usr/bin/env node
// Browser benchmark: hearth-llm (wasm CPU engine, and its WebGPU engine on the browser's adapter) vs
// wllama (llama.cpp in wasm) on the same GGUF, in ONE headless Chromium run (--enable-unsafe-webgpu;
// without a GPU, Chromium's adapter is SwiftShader, a CPU Vulkan: that row is a correctness-path
// figure, not GPU speed), on a cross-origin isolated page (COOP/COEP, so wllama can use its
// multi-threaded build). Same prompt, greedy, EOS ignored, same number of generated tokens.
// Per engine and thread count: one warm-up request, then `reps` measured ones; the median of each
// figure is printed. Before each measured request a different short one ('Hello', 1 token) runs on
// both engines, so hearth's prompt-prefix reuse cannot skip the measured prefill. Figures are each
// engine's own: hearth's usage.prefill_tok_s / decode_tok_s (decode = tokens after the first / their
// inter-token time), wllama's llama.cpp timings prompt_per_second / predicted_per_second; plus the
// wall time of the whole request measured in the page.
//
//   node scripts/bench-browser.mjs [--model gemma-3-270m-q4_k_m.gguf] [--tokens 64] [--reps 3] [--threads 1,2]
//        [--webgpu-tokens 16] [--webgpu-reps 1]   (--webgpu-reps 0 skips the WebGPU row)
// (scripts/bench-browser.sh builds the package first.) Not a test: it asserts nothing about speed.

import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { homedir, cpus, loadavg } from 'node:os';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';
import { serve } from '../tests/browser/server.js';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const arg = (name, fallback) => {
  const at = process.argv.indexOf(`--${name}`);
  return at > 0 ? process.argv[at + 1] : fallback;
};
const modelFile = arg('model', 'gemma-3-270m-q4_k_m.gguf');
const nTokens = Number(arg('tokens', 64));
const reps = Number(arg('reps', 3));
const webgpuTokens = Number(arg('webgpu-tokens', 16));
const webgpuReps = Number(arg('webgpu-reps', 1));
const wllamaThreads = arg('threads', `1,${Math.min(cpus().length, 8)}`).split(',').map(Number);
const modelsDir = process.env.HEARTH_MODELS_DIR ?? join(homedir(), '.cache/hearth/models');
const dist = join(root, 'web/hearth-llm/dist');
const wllamaDir = join(root, 'node_modules/@wllama/wllama/esm');

// ~110 tokens of plain prose: long enough for a prefill figure, no chat template needed.
const PROMPT = 'The history of the hearth is the history of the home. For most of human history the fire at the centre of the dwelling was where food was cooked, where light was found after dark, and where the household gathered to talk, to mend tools and clothing, and to tell the stories that carried knowledge from one generation to the next. Archaeologists read the layers of ash in ancient hearths to learn what people ate and how long they stayed in one place. In the chapters that follow, we trace';

for (const [what, path] of [['web/hearth-llm/dist (run scripts/build-web.sh)', join(dist, 'index.js')], ['@wllama/wllama (npm install)', join(wllamaDir, 'index.js')], [`${modelFile} in ${modelsDir}`, join(modelsDir, modelFile)]]) {
  if (!existsSync(path)) {
    console.error(`bench-browser: missing ${what}`);
    process.exit(1);
  }
}

const PROMPT_NOTE = `${PROMPT.length} characters`;
const isolation = { 'cross-origin-opener-policy': 'same-origin', 'cross-origin-embedder-policy': 'require-corp' };
const { server, origin } = await serve({ '/dist/': dist, '/wllama/': wllamaDir, '/models/': modelsDir, '/': join(root, 'tests/browser') }, isolation);
const browser = await chromium.launch({
  executablePath: process.env.HEARTH_CHROMIUM ?? '/usr/bin/chromium',
  args: ['--no-sandbox', '--disable-background-networking', '--headless=new', '--enable-unsafe-webgpu'],
});
const rows = [];
try {
  const page = await browser.newPage();
  page.on('pageerror', (error) => process.stderr.write(`[page error] ${error}\n`));
  await page.goto(`${origin}/page.html`);
  const env = await page.evaluate(() => ({ isolated: crossOriginIsolated, cores: navigator.hardwareConcurrency, ua: navigator.userAgent }));
  if (!env.isolated) throw new Error('the bench page is not cross-origin isolated: wllama would run single-threaded');
  const median = (values) => [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)];
  const summarize = (name, threads, runs) => ({
    name, threads, prompt_tokens: runs[0].prompt_tokens, generated: runs[0].generated,
    prefill: median(runs.map((r) => r.prefill)), decode: median(runs.map((r) => r.decode)), wall_ms: median(runs.map((r) => r.wall_ms)),
  });

  const runHearth = (backend, nTokens, reps) => page.evaluate(async ({ modelUrl, prompt, nTokens, reps, backend }) => {
    const { createEngine } = await import('/dist/index.js');
    const engine = await createEngine({ model: modelUrl, worker: true, cache: false, backend });
    const stats = await engine.runtimeStats();
    const run = async () => {
      // hearth reuses a cached prompt prefix: a different prompt first, so the measured one is evaluated
      // in full (all but the shared BOS token; prompt_tokens below counts the evaluated ones).
      await engine.completions.create({ prompt: 'Hello', temperature: 0, max_tokens: 1 });
      const started = performance.now();
      const reply = await engine.completions.create({ prompt, temperature: 0, max_tokens: nTokens, ignore_eos: true });
      const wall_ms = performance.now() - started;
      return { prompt_tokens: reply.usage.prompt_tokens - reply.hearth.prompt_cached, generated: reply.usage.completion_tokens, prefill: reply.usage.prefill_tok_s, decode: reply.usage.decode_tok_s, wall_ms, text: reply.choices[0].text };
    };
    await engine.completions.create({ prompt: 'Hello', temperature: 0, max_tokens: 4 }); // warm-up
    const runs = [];
    for (let i = 0; i < reps; i++) runs.push(await run());
    await engine.unload();
    return { runs, threads: stats.threads ?? 1, adapter: stats.adapter ? `${stats.adapter.device_type} adapter` : null };
  }, { modelUrl: `/models/${modelFile}`, prompt: PROMPT, nTokens, reps, backend });
  process.stderr.write('hearth-llm (cpu): loading…\n');
  const hearth = await runHearth('cpu', nTokens, reps);
  rows.push(summarize('hearth-llm (wasm CPU)', hearth.threads, hearth.runs));
  if (webgpuReps > 0) {
    process.stderr.write('hearth-llm (webgpu): loading…\n');
    const gpu = await runHearth('webgpu', webgpuTokens, webgpuReps);
    rows.push(summarize(`hearth-llm (WebGPU: ${gpu.adapter}; ${webgpuTokens} generated)`, '—', gpu.runs));
  }

  for (const threads of wllamaThreads) {
    process.stderr.write(`wllama, ${threads} thread(s): loading…\n`);
    const wl = await page.evaluate(async ({ modelUrl, prompt, nTokens, reps, threads }) => {
      const { Wllama } = await import('/wllama/index.js');
      const wllama = new Wllama({ default: '/wllama/wasm/wllama.wasm' }, { suppressNativeLog: true, logger: { debug() {}, log() {}, warn: console.warn, error: console.error } });
      const blob = await (await fetch(modelUrl)).blob();
      await wllama.loadModel([blob], { n_threads: threads, n_ctx: 1024, n_gpu_layers: 0, seed: 1 });
      const run = async () => {
        await wllama.createCompletion({ prompt: 'Hello', max_tokens: 1, temp: 0, cache_prompt: false }); // as for hearth
        const started = performance.now();
        const reply = await wllama.createCompletion({ prompt, max_tokens: nTokens, temp: 0, temperature: 0, top_k: 1, ignore_eos: true, cache_prompt: false });
        const wall_ms = performance.now() - started;
        const t = reply.timings;
        return { prompt_tokens: t.prompt_n, generated: t.predicted_n, prefill: t.prompt_per_second, decode: t.predicted_per_second, wall_ms, text: reply.choices[0].text };
      };
      await wllama.createCompletion({ prompt: 'Hello', max_tokens: 4, temp: 0, cache_prompt: false }); // warm-up
      const runs = [];
      for (let i = 0; i < reps; i++) runs.push(await run());
      const info = { multithread: wllama.isMultithread(), threads: wllama.getNumThreads() };
      await wllama.exit();
      return { runs, ...info };
    }, { modelUrl: `/models/${modelFile}`, prompt: PROMPT, nTokens, reps, threads });
    rows.push(summarize(`wllama ${wl.multithread ? 'multi' : 'single'}-thread build`, wl.threads, wl.runs));
    if (wl.runs[0].text !== hearth.runs[0].text) process.stderr.write(`note: texts differ (hearth ${JSON.stringify(hearth.runs[0].text.slice(0, 60))}… vs wllama ${JSON.stringify(wl.runs[0].text.slice(0, 60))}…)\n`);
  }

  const hearthRow = rows[0];
  const fmt = (n, d = 1) => n.toFixed(d);
  console.log(`\n${modelFile}: prompt ${PROMPT_NOTE}, ${rows.map((r) => r.prompt_tokens).join('/')} tokens evaluated, ${nTokens} generated (greedy, EOS ignored), median of ${reps} after a warm-up`);
  console.log(`${env.ua.match(/Chrome\/[\d.]+/)?.[0] ?? 'Chromium'}, crossOriginIsolated, navigator.hardwareConcurrency = ${env.cores}, load average ${loadavg().map((l) => l.toFixed(1)).join(' ')}\n`);
  console.log('| engine | threads | prefill tok/s | decode tok/s | request wall ms | hearth prefill ratio | hearth decode ratio |');
  console.log('|---|---|---|---|---|---|---|');
  for (const row of rows) {
    const ratios = row === hearthRow ? ['—', '—'] : [`${fmt(hearthRow.prefill / row.prefill, 2)}x`, `${fmt(hearthRow.decode / row.decode, 2)}x`];
    console.log(`| ${row.name} | ${row.threads} | ${fmt(row.prefill)} | ${fmt(row.decode)} | ${fmt(row.wall_ms, 0)} | ${ratios.join(' | ')} |`);
  }
} finally {
  await browser.close();
  server.close();
}
