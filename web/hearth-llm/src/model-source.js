// Model bytes from a URL (fetched with progress), a File/Blob, or bytes already in memory.
// Returns { bytes: Uint8Array, owned: boolean } (owned = we allocated it, so it may be transferred).

export async function readModel(model, onProgress) {
  if (model instanceof Uint8Array) return { bytes: model, owned: false };
  if (model instanceof ArrayBuffer) return { bytes: new Uint8Array(model), owned: false };
  if (typeof Blob !== 'undefined' && model instanceof Blob) {
    onProgress?.({ phase: 'read', loaded: 0, total: model.size });
    const bytes = new Uint8Array(await model.arrayBuffer());
    onProgress?.({ phase: 'read', loaded: bytes.byteLength, total: model.size });
    return { bytes, owned: true };
  }
  if (typeof model === 'string' || model instanceof URL) return { bytes: await download(String(model), onProgress), owned: true };
  throw new TypeError('createEngine: `model` must be a URL (string or URL), a File/Blob, a Uint8Array or an ArrayBuffer');
}

async function download(url, onProgress) {
  const response = await fetch(url);
  if (!response.ok) throw new Error(`createEngine: fetching the model from ${url} failed: HTTP ${response.status} ${response.statusText}`);
  const total = Number(response.headers.get('content-length')) || 0;
  if (!response.body) {
    const bytes = new Uint8Array(await response.arrayBuffer());
    onProgress?.({ phase: 'download', loaded: bytes.byteLength, total: bytes.byteLength });
    return bytes;
  }
  // One buffer of the announced size avoids holding the chunks and their concatenation at once.
  let buffer = new Uint8Array(total || 1 << 20);
  let loaded = 0;
  const reader = response.body.getReader();
  onProgress?.({ phase: 'download', loaded, total });
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    if (loaded + value.byteLength > buffer.byteLength) {
      const grown = new Uint8Array(Math.max(buffer.byteLength * 2, loaded + value.byteLength));
      grown.set(buffer.subarray(0, loaded));
      buffer = grown;
    }
    buffer.set(value, loaded);
    loaded += value.byteLength;
    onProgress?.({ phase: 'download', loaded, total });
  }
  return loaded === buffer.byteLength ? buffer : buffer.slice(0, loaded);
}
