// index.d.ts matches the package: tests/types/usage.ts (the public API as a user writes it) type-checks
// with tsc against web/hearth-llm/dist/index.d.ts, every runtime export is declared, and the
// HearthErrorCode union equals the codes errors.js can produce. webllm.d.ts likewise: WebLLM's own
// examples (tests/fixtures/webllm-examples) type-check with "@mlc-ai/web-llm" resolved to it, and
// every export of webllm.js is declared. Needs `npm install` (typescript, typebox).

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '../..');
const dts = readFileSync(join(root, 'web/hearth-llm/dist/index.d.ts'), 'utf8');

test('tests/types/usage.ts type-checks against index.d.ts', () => {
  execFileSync(join(root, 'node_modules/.bin/tsc'), ['-p', join(root, 'tests/types')], { stdio: 'inherit' });
});

test('WebLLM\'s examples type-check against webllm.d.ts', () => {
  execFileSync(join(root, 'node_modules/.bin/tsc'), ['-p', join(root, 'tests/types-webllm')], { stdio: 'inherit' });
});

for (const entry of ['index', 'webllm']) {
  test(`every runtime export is declared in ${entry}.d.ts`, async () => {
    const runtime = Object.keys(await import(join(root, `web/hearth-llm/dist/${entry}.js`)));
    const text = readFileSync(join(root, `web/hearth-llm/dist/${entry}.d.ts`), 'utf8');
    const declared = new Set([...text.matchAll(/^export (?:declare )?(?:function|class|interface|type|const) (\w+)/gm)].map((m) => m[1]));
    for (const match of text.matchAll(/^export \{([^}]+)\}/gm)) match[1].split(',').forEach((name) => declared.add(name.trim()));
    assert.deepEqual(runtime.filter((name) => !declared.has(name)), []);
  });
}

test('HearthErrorCode lists exactly the codes errors.js knows', async () => {
  const { ERROR_CODES } = await import(join(root, 'web/hearth-llm/dist/errors.js'));
  const union = /export type HearthErrorCode =([^;]+);/.exec(dts)[1];
  const declared = [...union.matchAll(/'([a-z-]+)'/g)].map((m) => m[1]);
  assert.deepEqual([...declared].sort(), [...ERROR_CODES].sort());
});
