// index.d.ts matches the package: tests/types/usage.ts (the public API as a user writes it) type-checks
// with tsc against web/hearth-llm/dist/index.d.ts, every runtime export is declared, and the
// HearthErrorCode union equals the codes errors.js can produce. Needs `npm install` (typescript).

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

test('every runtime export is declared in index.d.ts', async () => {
  const runtime = Object.keys(await import(join(root, 'web/hearth-llm/dist/index.js')));
  const declared = new Set([...dts.matchAll(/^export (?:declare )?(?:function|class|interface|type|const) (\w+)/gm)].map((m) => m[1]));
  assert.deepEqual(runtime.filter((name) => !declared.has(name)), []);
});

test('HearthErrorCode lists exactly the codes errors.js knows', async () => {
  const { ERROR_CODES } = await import(join(root, 'web/hearth-llm/dist/errors.js'));
  const union = /export type HearthErrorCode =([^;]+);/.exec(dts)[1];
  const declared = [...union.matchAll(/'([a-z-]+)'/g)].map((m) => m[1]);
  assert.deepEqual([...declared].sort(), [...ERROR_CODES].sort());
});
