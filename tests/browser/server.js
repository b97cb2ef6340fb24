// A tiny static server for the browser tests: the built package under /dist/, the test page, and
// the model file under /models/ (streamed, with Content-Length so download progress has a total).

import { createServer } from 'node:http';
import { createReadStream, existsSync, statSync } from 'node:fs';
import { extname, join, normalize } from 'node:path';

const TYPES = { '.js': 'text/javascript', '.wasm': 'application/wasm', '.html': 'text/html', '.ts': 'text/plain', '.gguf': 'application/octet-stream' };

/** routes: { '/prefix/': directory }; `headers` are added to every response (e.g. COOP/COEP).
 * Resolves to { server, origin }. */
export function serve(routes, headers = {}) {
  const server = createServer((request, response) => {
    const path = decodeURIComponent(new URL(request.url, 'http://x').pathname);
    for (const [prefix, directory] of Object.entries(routes)) {
      if (!path.startsWith(prefix)) continue;
      const file = normalize(join(directory, path.slice(prefix.length)));
      if (!file.startsWith(normalize(directory)) || !existsSync(file) || !statSync(file).isFile()) break;
      response.writeHead(200, { ...headers, 'content-type': TYPES[extname(file)] ?? 'application/octet-stream', 'content-length': statSync(file).size, 'cache-control': 'no-store' });
      createReadStream(file).pipe(response);
      return;
    }
    response.writeHead(404, { ...headers, 'content-type': 'text/plain' });
    response.end(`not found: ${path}`);
  });
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve({ server, origin: `http://127.0.0.1:${server.address().port}` })));
}
