// A tiny static server for the browser tests: the built package under /dist/, the test page, and
// the model file under /models/ (streamed, with Content-Length so download progress has a total).
// Answers `Range: bytes=a-b` with 206 (the WebGPU loader reads a model by ranges). Every request is
// recorded in `log` ({ path, range, status, bytes }) so tests can check how a model was read.

import { createServer } from 'node:http';
import { createReadStream, existsSync, statSync } from 'node:fs';
import { extname, join, normalize } from 'node:path';
import { chromium } from 'playwright-core';

const TYPES = { '.js': 'text/javascript', '.mjs': 'text/javascript', '.wasm': 'application/wasm', '.html': 'text/html', '.ts': 'text/plain', '.gguf': 'application/octet-stream' };

/** routes: { '/prefix/': directory }; `headers` are added to every response (e.g. COOP/COEP).
 * Resolves to { server, origin, log }. */
export function serve(routes, headers = {}) {
  const log = [];
  const server = createServer((request, response) => {
    const path = decodeURIComponent(new URL(request.url, 'http://x').pathname);
    for (const [prefix, directory] of Object.entries(routes)) {
      if (!path.startsWith(prefix)) continue;
      const file = normalize(join(directory, path.slice(prefix.length)));
      if (!file.startsWith(normalize(directory)) || !existsSync(file) || !statSync(file).isFile()) break;
      const size = statSync(file).size;
      const common = { ...headers, 'content-type': TYPES[extname(file)] ?? 'application/octet-stream', 'cache-control': 'no-store', 'accept-ranges': 'bytes' };
      const range = request.headers.range;
      const match = /^bytes=(\d+)-(\d*)$/.exec(range ?? '');
      if (range !== undefined) {
        const start = match ? Number(match[1]) : NaN;
        const end = match && match[2] !== '' ? Math.min(Number(match[2]), size - 1) : size - 1;
        if (!(start <= end)) {
          log.push({ path, range, status: 416, bytes: 0 });
          response.writeHead(416, { ...common, 'content-range': `bytes */${size}` });
          response.end();
          return;
        }
        log.push({ path, range, status: 206, bytes: end - start + 1 });
        response.writeHead(206, { ...common, 'content-length': end - start + 1, 'content-range': `bytes ${start}-${end}/${size}` });
        if (request.method === 'HEAD') response.end();
        else createReadStream(file, { start, end }).pipe(response);
        return;
      }
      log.push({ path, range: null, status: 200, bytes: request.method === 'HEAD' ? 0 : size });
      response.writeHead(200, { ...common, 'content-length': size });
      if (request.method === 'HEAD') response.end();
      else createReadStream(file).pipe(response);
      return;
    }
    log.push({ path, range: request.headers.range ?? null, status: 404, bytes: 0 });
    response.writeHead(404, { ...headers, 'content-type': 'text/plain' });
    response.end(`not found: ${path}`);
  });
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve({ server, origin: `http://127.0.0.1:${server.address().port}`, log })));
}

/** Chromium's switch for WebGPU without a GPU (SwiftShader, Vulkan on the CPU). */
export const WEBGPU = ['--enable-unsafe-webgpu'];

/** Headless Chromium as every browser test runs it ($HEARTH_CHROMIUM, else /usr/bin/chromium),
 * with `extraArgs` (such as WEBGPU). */
export function launchChromium(extraArgs = []) {
  return chromium.launch({
    executablePath: process.env.HEARTH_CHROMIUM ?? '/usr/bin/chromium',
    args: ['--no-sandbox', '--disable-background-networking', '--headless=new', ...extraArgs],
  });
}

/** The test page (`${origin}/page.html`) in a new context of `browser`, its console and errors
 * written to stderr; `onRequest` (if given) sees the URL of every request the context makes. */
export async function openTestPage(browser, origin, onRequest = null) {
  const context = await browser.newContext();
  if (onRequest) context.on('request', (request) => onRequest(request.url()));
  const page = await context.newPage();
  page.on('console', (message) => process.stderr.write(`[page ${message.type()}] ${message.text()}\n`));
  page.on('pageerror', (error) => process.stderr.write(`[page error] ${error}\n`));
  await page.goto(`${origin}/page.html`);
  return page;
}
