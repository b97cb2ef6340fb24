#!/usr/bin/env node
// The private chat app's static server (no dependencies), on 127.0.0.1 only:
//   /chat/             web/chat (the app; `/` redirects here)
//   /hearth-llm/dist/  the built package (web/hearth-llm/dist), so the app's `../hearth-llm/dist/index.js`
//                      resolves the same way on disk and over HTTP
//   /models/           the model cache ($HEARTH_MODELS_DIR, else ~/.cache/hearth/models)
// Pages are served cross-origin isolated (COOP/COEP), so SharedArrayBuffer is available to the page.
// (Stopping a reply does not need it: the engine's worker hears a cancel between decode steps.)
//
//   node web/chat/serve.js [--port 8080]     (port 0 = any free port)

import { createServer } from 'node:http';
import { createReadStream, statSync } from 'node:fs';
import { extname, join, resolve, sep, dirname } from 'node:path';
import { homedir } from 'node:os';
import { fileURLToPath } from 'node:url';

const TYPES = {
  '.html': 'text/html; charset=utf-8', '.js': 'text/javascript; charset=utf-8', '.css': 'text/css; charset=utf-8',
  '.wasm': 'application/wasm', '.json': 'application/json', '.ts': 'text/plain; charset=utf-8',
  '.svg': 'image/svg+xml', '.png': 'image/png', '.gguf': 'application/octet-stream',
};

const webDir = resolve(dirname(fileURLToPath(import.meta.url)), '..');

export function defaultModelsDir() {
  if (process.env.HEARTH_MODELS_DIR) return process.env.HEARTH_MODELS_DIR;
  if (process.env.HEARTH_CACHE_DIR) return join(process.env.HEARTH_CACHE_DIR, 'models');
  return join(homedir(), '.cache/hearth/models');
}

/** The file under `directory` that `relative` names, or null (outside it, missing, not a file). */
function fileIn(directory, relative) {
  const root = resolve(directory);
  const file = resolve(root, `.${sep}${relative}`);
  if (file !== root && !file.startsWith(root + sep)) return null;
  try {
    const stats = statSync(file);
    return stats.isFile() ? { file, size: stats.size } : stats.isDirectory() ? fileIn(file, 'index.html') : null;
  } catch {
    return null;
  }
}

/** Resolves to { server, origin }. Options: port (0 = any), modelsDir, distDir, chatDir. */
export function startServer({ port = 8080, modelsDir = defaultModelsDir(), distDir = join(webDir, 'hearth-llm/dist'), chatDir = join(webDir, 'chat') } = {}) {
  const routes = [['/chat/', chatDir], ['/hearth-llm/dist/', distDir], ['/models/', modelsDir]];
  const server = createServer((request, response) => {
    const headers = { 'cross-origin-opener-policy': 'same-origin', 'cross-origin-embedder-policy': 'require-corp', 'x-content-type-options': 'nosniff' };
    let path;
    try {
      path = decodeURIComponent(new URL(request.url, 'http://localhost').pathname);
    } catch {
      response.writeHead(400, headers).end('bad request');
      return;
    }
    if (request.method !== 'GET' && request.method !== 'HEAD') {
      response.writeHead(405, { ...headers, allow: 'GET, HEAD' }).end('method not allowed');
      return;
    }
    if (path === '/' || path === '/chat') {
      response.writeHead(302, { ...headers, location: '/chat/' }).end();
      return;
    }
    for (const [prefix, directory] of routes) {
      if (!path.startsWith(prefix)) continue;
      const found = fileIn(directory, path.slice(prefix.length));
      if (!found) break;
      response.writeHead(200, {
        ...headers,
        'content-type': TYPES[extname(found.file)] ?? 'application/octet-stream',
        'content-length': found.size,
        'cache-control': 'no-cache',
      });
      if (request.method === 'HEAD') response.end();
      else createReadStream(found.file).pipe(response);
      return;
    }
    response.writeHead(404, { ...headers, 'content-type': 'text/plain; charset=utf-8' }).end(`not found: ${path}`);
  });
  return new Promise((resolvePromise, reject) => {
    server.once('error', reject);
    server.listen(port, '127.0.0.1', () => resolvePromise({ server, origin: `http://127.0.0.1:${server.address().port}` }));
  });
}

if (process.argv[1] && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const portFlag = process.argv.indexOf('--port');
  const port = portFlag > 0 ? Number(process.argv[portFlag + 1]) : Number(process.env.PORT ?? 8080);
  if (!Number.isInteger(port) || port < 0 || port > 65535) {
    console.error(`serve.js: bad port ${process.argv[portFlag + 1] ?? process.env.PORT}`);
    process.exit(2);
  }
  const modelsDir = defaultModelsDir();
  startServer({ port, modelsDir }).then(({ origin }) => {
    console.log(`hearth chat: ${origin}/chat/   (models from ${modelsDir}; Ctrl-C to stop)`);
  }, (error) => {
    console.error(`serve.js: ${error.message}`);
    process.exit(1);
  });
}
