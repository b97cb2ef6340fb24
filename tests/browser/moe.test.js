// Mixture-of-experts models in headless Chromium, on both browser engines: the synthetic qwen3moe
// of tests/fixtures/synthetic (8 experts, 2 per token; 1 MB) greedy-generates on backend 'webgpu'
// (SwiftShader) and on backend 'cpu' (the wasm engine's expert ops), and both must give exactly
// the native CPU backend's tokens (tests/fixtures/browser/, made by generate.sh):
// - f32 weights on a 9-token prompt: the experts.wgsl routing and quant.wgsl's EXPERTS variant;
// - Q8_0 weights on an 18-token prompt: matmul_q8.wgsl, its pairs grouped by expert
//   (group_experts, EXPERTS_GROUPED) for the prompt and one product a pair (EXPERTS) to decode.
// Every step of each fixture is decisive (CPU top-1 / top-2 margin >= 0.5 nats) and no evaluated
// token has its 2nd and 3rd router probabilities within 3e-3 of each other, so neither another
// summation order nor another expert choice can flip a token: they are compared exactly.
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
const fixtures = ['synthetic_qwen3moe_greedy.json', 'synthetic_qwen3moe_q8_0_long_greedy.json'].map((name) =>
  JSON.parse(readFileSync(join(root, 'tests/fixtures/browser', name), 'utf8')));
// Below this CPU margin (nats) another f32 summation order could flip the greedy choice (the rule
// of webgpu.test.js); the fixture must be above it at every step.
const DECISIVE_MARGIN = 0.5;

let server, origin, browser, page;

before(async () => {
  assert.ok(existsSync(join(dist, 'index.js')), 'web/hearth-llm/dist is missing: run scripts/build-web.sh');
  ({ server, origin } = await serve({ '/dist/': dist, '/models/': synthetic, '/': dirname(fileURLToPath(import.meta.url)) }));
  browser = await launchChromium(WEBGPU);
  page = await openTestPage(browser, origin);
});

after(async () => {
  await browser?.close();
  server?.close();
});

for (const expected of fixtures) for (const backend of ['webgpu', 'cpu']) {
  test(`${expected.model_file} (${expected.prompt_tokens.length}-token prompt) on backend '${backend}' gives the native CPU backend's greedy tokens`, { timeout: 900_000 }, async () => {
    assert.deepEqual(expected.margins.filter((m) => m < DECISIVE_MARGIN), [], 'the fixture has a near-tie: pick another prompt in generate.sh');
    const result = await page.evaluate(async ({ modelUrl, prompt, maxTokens, backend }) => {
      const { createEngine } = await import('/dist/index.js');
      const engine = await createEngine({ model: modelUrl, backend, worker: true, cache: false });
      const completion = await engine.completions.create({ prompt, temperature: 0, max_tokens: maxTokens, ignore_eos: true });
      const stats = await engine.runtimeStats();
      await engine.unload();
      return { completion, stats };
    }, { modelUrl: `/models/${expected.model_file}`, prompt: expected.prompt, maxTokens: expected.tokens.length, backend });
    process.stderr.write(`${expected.model_file} on ${result.stats.backend}: ${JSON.stringify(result.completion.hearth.token_ids)}\n`);
    assert.equal(result.stats.backend, backend === 'cpu' ? 'cpu-wasm' : 'webgpu', JSON.stringify(result.stats));
    assert.deepEqual(result.completion.hearth.prompt_token_ids, expected.prompt_tokens);
    assert.deepEqual(result.completion.hearth.token_ids, expected.tokens);
    assert.equal(result.completion.choices[0].text, expected.text);
  });
}
