// The private chat app (web/chat) end to end in headless Chromium, served by its own web/chat/serve.js:
// the model is loaded through the URL typed into the URL field (Qwen2.5-Coder-0.5B, which has a chat
// template; ~30-60 s to load in wasm), a message typed into the composer gets a streamed answer
// (max tokens set to 8 in the UI), the stats show tok/s, the chat is kept in localStorage, model
// text is never turned into markup, prompt lookup drafts from the conversation without changing
// the greedy answer, and no request leaves the page's origin.
// Screenshot: tests/browser/artifacts/chat-app.png.
//
// Needs what gemma.test.js needs, with qwen2.5-coder-0.5b-instruct-q4_k_m.gguf in the models dir.

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdirSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';
import { startServer, defaultModelsDir } from '../../web/chat/serve.js';

const here = dirname(fileURLToPath(import.meta.url));
const root = join(here, '../..');
const modelFile = 'qwen2.5-coder-0.5b-instruct-q4_k_m.gguf';
const modelsDir = defaultModelsDir();
const artifacts = join(here, 'artifacts');

let server, origin, browser, page;
const requests = [];
const pageErrors = [];

before(async () => {
  assert.ok(existsSync(join(root, 'web/hearth-llm/dist/index.js')), 'web/hearth-llm/dist is missing: run scripts/build-web.sh');
  assert.ok(existsSync(join(modelsDir, modelFile)), `${modelFile} is missing from ${modelsDir} (hearth models fetch qwen2.5-coder-0.5b)`);
  ({ server, origin } = await startServer({ port: 0, modelsDir }));
  browser = await chromium.launch({
    executablePath: process.env.HEARTH_CHROMIUM ?? '/usr/bin/chromium',
    args: ['--no-sandbox', '--disable-background-networking', '--headless=new'],
  });
  const context = await browser.newContext({ viewport: { width: 1200, height: 800 } });
  context.on('request', (request) => requests.push(request.url()));
  page = await context.newPage();
  page.on('console', (message) => process.stderr.write(`[page ${message.type()}] ${message.text()}\n`));
  page.on('pageerror', (error) => {
    pageErrors.push(String(error));
    process.stderr.write(`[page error] ${error}\n`);
  });
  await page.goto(`${origin}/`); // redirects to /chat/
});

after(async () => {
  await browser?.close();
  server?.close();
});

test('the page is cross-origin isolated and starts with an empty chat and no model', async () => {
  assert.equal(new URL(page.url()).pathname, '/chat/');
  assert.equal(await page.evaluate(() => crossOriginIsolated), true);
  assert.equal(await page.locator('#send').isDisabled(), true);
  assert.equal(await page.locator('#model-url').inputValue(), `/models/${modelFile}`);
  await page.waitForFunction(() => document.querySelector('#cache-summary').textContent === '(none)', null, { timeout: 10_000 });
});

test('markdown rendering never turns model text into markup', async () => {
  const result = await page.evaluate(async () => {
    const { renderMarkdown } = await import('/chat/markdown.js');
    const box = document.createElement('div');
    renderMarkdown(box, 'Use `<b>x</b>` here <img src=x onerror="window.pwned=1">\n\n```html\n<script>window.pwned=2</script>\n```\nafter');
    return {
      tags: [...box.querySelectorAll('*')].map((e) => e.tagName.toLowerCase()),
      inline: box.querySelector('p code').textContent,
      block: box.querySelector('pre code').textContent,
      lang: box.querySelector('figcaption span').textContent,
      copy: box.querySelector('button.copy')?.textContent,
      paragraphs: [...box.querySelectorAll('p')].map((p) => p.textContent),
    };
  });
  assert.deepEqual(result.tags, ['p', 'code', 'figure', 'figcaption', 'span', 'button', 'pre', 'code', 'p']);
  assert.equal(result.inline, '<b>x</b>');
  assert.equal(result.block, '<script>window.pwned=2</script>');
  assert.equal(result.lang, 'html');
  assert.equal(result.copy, 'Copy');
  assert.deepEqual(result.paragraphs, ['Use <b>x</b> here <img src=x onerror="window.pwned=1">', 'after']);
});

test('load Qwen through the URL field, then chat: a streamed answer with stats', { timeout: 900_000 }, async () => {
  await page.fill('#model-url', `/models/${modelFile}`);
  await page.click('#load-url');
  await page.locator('#progress-row').waitFor({ state: 'visible', timeout: 60_000 });
  await page.waitForFunction(() => document.body.dataset.model === 'ready' || document.querySelector('#model-status.error'), null, { timeout: 600_000, polling: 500 });
  const status = await page.locator('#model-status').textContent();
  assert.match(status, /^Loaded qwen2\.5-coder-0\.5b-instruct-q4_k_m\.gguf/, status);
  assert.equal(await page.locator('#progress').getAttribute('value'), '1');

  await page.locator('#settings summary').click();
  await page.fill('#max-tokens', '8');
  await page.fill('#temperature', '0');
  await page.fill('#prompt', 'Write a Python function that adds two numbers.');
  await page.press('#prompt', 'Enter');
  await page.waitForFunction(() => document.body.dataset.lastAnswer, null, { timeout: 300_000, polling: 250 });
  assert.equal(await page.evaluate(() => document.body.dataset.lastAnswer), 'done');

  const user = await page.locator('.message.user').allTextContents();
  assert.deepEqual(user, ['Write a Python function that adds two numbers.']);
  const answer = await page.locator('.message.assistant .body').textContent();
  assert.ok(answer.trim().length > 0, 'the answer is empty');
  const meta = await page.locator('.message.assistant .meta').textContent();
  // (Prompt lookup is on by default: the meta may count its drafts.)
  assert.match(meta, /TTFT \d+ ms · \d+(\.\d)? tok\/s · 8 tokens · (\d+ of \d+ drafts kept · )?max tokens reached/, meta);
  const stats = await page.locator('#stats').textContent();
  assert.match(stats, /\d+(\.\d)? tok\/s/, stats);
  process.stderr.write(`chat app answer: ${JSON.stringify(answer)} — ${meta}\n`);

  // The conversation is in localStorage and listed in the sidebar.
  const saved = await page.evaluate(() => JSON.parse(localStorage.getItem('hearth-chat.v1')));
  const chat = saved.chats.find((c) => c.id === saved.currentId);
  assert.deepEqual(chat.messages.map((m) => m.role), ['user', 'assistant']);
  assert.equal(chat.messages[1].stats.completion_tokens, 8);
  assert.equal(await page.locator('.chat-item.current .open').textContent(), 'Write a Python function that adds two nu…');
  assert.equal(await page.locator('#regenerate').isDisabled(), false);

  mkdirSync(artifacts, { recursive: true });
  await page.screenshot({ path: join(artifacts, 'chat-app.png') });
});

test('regenerate replaces the last answer; stop ends it early', { timeout: 600_000 }, async () => {
  const before = await page.locator('.message.assistant .body').textContent();
  await page.fill('#max-tokens', '200');
  await page.evaluate(() => delete document.body.dataset.lastAnswer);
  await page.click('#regenerate');
  assert.equal(await page.locator('#stop').isDisabled(), false);
  await page.waitForFunction(() => document.querySelector('.message.assistant.streaming .body')?.textContent.length > 0, null, { timeout: 300_000, polling: 100 });
  await page.click('#stop');
  await page.waitForFunction(() => document.body.dataset.lastAnswer, null, { timeout: 60_000, polling: 100 });
  assert.equal(await page.locator('.message').count(), 2);
  const meta = await page.locator('.message.assistant .meta').textContent();
  assert.match(meta, /stopped/, meta);
  const tokens = Number(/(\d+) tokens/.exec(meta)?.[1]);
  assert.ok(tokens >= 1 && tokens < 200, meta);
  assert.ok((await page.locator('.message.assistant .body').textContent()).length > 0, `was: ${before}`);

  // New chat: an empty conversation; the old one stays in the list.
  await page.click('#new-chat');
  assert.equal(await page.locator('.message').count(), 0);
  assert.equal(await page.locator('.chat-item').count(), 2);
});

/** Sends `text` in the current chat (or regenerates with `text` null) and waits for the answer: its body and meta. */
async function answer(text) {
  await page.evaluate(() => delete document.body.dataset.lastAnswer);
  if (text === null) {
    await page.click('#regenerate');
  } else {
    await page.fill('#prompt', text);
    await page.press('#prompt', 'Enter');
  }
  await page.waitForFunction(() => document.body.dataset.lastAnswer, null, { timeout: 300_000, polling: 250 });
  assert.equal(await page.evaluate(() => document.body.dataset.lastAnswer), 'done');
  const last = page.locator('.message.assistant').last();
  return { body: await last.locator('.body').textContent(), meta: await last.locator('.meta').textContent() };
}

test('prompt lookup (the default) drafts from the chat and keeps the greedy answer; off gives the same answer', { timeout: 600_000 }, async () => {
  assert.equal(await page.locator('.message').count(), 0, 'starts in the new chat of the previous test');
  assert.equal(await page.locator('#speculative').inputValue(), 'lookup');
  await page.fill('#max-tokens', '12');
  await answer('Write a Python function that adds two numbers.');
  const withLookup = await answer('Repeat that function exactly.');
  const kept = /(\d+) of (\d+) drafts kept/.exec(withLookup.meta);
  assert.ok(kept && Number(kept[2]) > 0, `the follow-up should have drafted from the first answer: ${withLookup.meta}`);
  await page.selectOption('#speculative', 'off');
  const plain = await answer(null);
  assert.doesNotMatch(plain.meta, /drafts kept/, plain.meta);
  assert.equal(plain.body, withLookup.body, 'greedy answers with and without prompt lookup differ');
  process.stderr.write(`chat app follow-up: ${JSON.stringify(plain.body)} — lookup: ${withLookup.meta}; off: ${plain.meta}\n`);
  await page.selectOption('#speculative', 'lookup');
});

test('answer format: a JSON Schema typed in Settings constrains the answer', { timeout: 600_000 }, async () => {
  await page.click('#new-chat');
  await page.fill('#max-tokens', '48');
  await page.selectOption('#answer-format', 'schema');
  assert.ok(await page.locator('#answer-schema').isVisible(), 'the schema field shows with its format');
  const schema = { type: 'object', properties: { language: { enum: ['Python', 'Rust', 'C'] }, year: { type: 'integer' } }, required: ['language', 'year'], additionalProperties: false };
  await page.fill('#answer-schema', JSON.stringify(schema));
  await answer('Which language is Guido van Rossum known for, and when did it appear?');
  const code = page.locator('.message.assistant').last().locator('pre code');
  assert.equal(await code.count(), 1, 'a JSON answer is shown as code');
  const body = await code.textContent();
  const value = JSON.parse(body);
  assert.deepEqual(Object.keys(value).sort(), ['language', 'year']);
  assert.ok(schema.properties.language.enum.includes(value.language) && Number.isInteger(value.year), body);
  // A schema that is not JSON is reported in the chat, not thrown.
  await page.fill('#answer-schema', '{"type": ');
  await page.evaluate(() => delete document.body.dataset.lastAnswer);
  await page.click('#regenerate');
  await page.waitForFunction(() => document.body.dataset.lastAnswer, null, { timeout: 60_000, polling: 100 });
  assert.match(await page.locator('.message.assistant .body').last().textContent(), /the JSON Schema in Settings is not valid JSON/);
  await page.selectOption('#answer-format', 'text');
  assert.ok(!(await page.locator('#answer-schema').isVisible()));
});

test('the loaded model is listed as cached; Delete removes it', { timeout: 60_000 }, async () => {
  await page.locator('#cache-panel summary').click();
  await page.waitForFunction(() => document.querySelectorAll('#cached-models li').length === 1, null, { timeout: 10_000 });
  assert.match(await page.locator('#cached-models li .name').textContent(), /^qwen2\.5-coder-0\.5b-instruct-q4_k_m\.gguf · \d+ MiB$/);
  assert.match(await page.locator('#cache-summary').textContent(), /^\(1, \d+ MiB\)$/);
  await page.click('#cached-models li .delete');
  await page.waitForFunction(() => document.querySelectorAll('#cached-models li').length === 0, null, { timeout: 10_000 });
  assert.equal(await page.locator('#cache-summary').textContent(), '(none)');
  assert.deepEqual(await page.evaluate(async () => (await import('/hearth-llm/dist/index.js')).listCachedModels()), []);
});

test('no request left the page origin and the page raised no errors', () => {
  assert.ok(requests.some((url) => url.endsWith(`/models/${modelFile}`)), 'the model was not fetched from the app server');
  const foreign = requests.filter((url) => !url.startsWith(`${origin}/`));
  assert.deepEqual(foreign, []);
  assert.deepEqual(pageErrors, []);
});
