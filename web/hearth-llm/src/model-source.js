// Model bytes from a URL (the model cache first, else fetched with progress and cached while it
// downloads), a File/Blob, or bytes already in memory.
// Returns { bytes: Uint8Array, owned: boolean, fromCache: boolean, warning?: HearthError }
// (owned = we allocated it, so it may be transferred to the worker).
//
// Progress events: { phase: 'download' | 'cache' | 'read', loaded, total, fromCache, warning? }.

import { absoluteUrl, openCache } from './cache.js';
import { HearthError, hearthError, toHearthError, checkModelSize } from './errors.js';

/** `cache`: true (default) · false (no cache read or write) · 'revalidate' (HEAD: ETag/length must match). */
export async function readModel(model, { onProgress, cache = true, signal } = {}) {
  if (model instanceof Uint8Array) return { bytes: model, owned: false, fromCache: false };
  if (model instanceof ArrayBuffer) return { bytes: new Uint8Array(model), owned: false, fromCache: false };
  if (typeof Blob !== 'undefined' && model instanceof Blob) {
    const bytes = await readBlob(model, 'read', false, onProgress, signal);
    return { bytes, owned: true, fromCache: false };
  }
  if (typeof model === 'string' || model instanceof URL) return readUrl(absoluteUrl(model), { onProgress, cache, signal });
  throw hearthError('bad-argument', 'createEngine: `model` must be a URL (string or URL), a File/Blob, a Uint8Array or an ArrayBuffer');
}

function checkAborted(signal) {
  if (signal?.aborted) throw hearthError('aborted', 'createEngine was aborted', signal.reason);
}

/** Reads a Blob (a File, or a cached model on disk) into one buffer, with progress. */
async function readBlob(blob, phase, fromCache, onProgress, signal) {
  const total = blob.size;
  checkModelSize(total);
  let bytes;
  try {
    bytes = new Uint8Array(total);
  } catch (error) {
    throw hearthError('out-of-memory', `could not allocate ${total} bytes for the model (${error.message})`, error);
  }
  onProgress?.({ phase, loaded: 0, total, fromCache });
  const reader = blob.stream().getReader();
  let loaded = 0;
  for (;;) {
    checkAborted(signal);
    const { done, value } = await reader.read();
    if (done) break;
    bytes.set(value, loaded);
    loaded += value.byteLength;
    onProgress?.({ phase, loaded, total, fromCache });
  }
  return bytes;
}

async function readUrl(url, { onProgress, cache, signal }) {
  const store = cache ? await openCache() : null;
  if (store) {
    const hit = await store.get(url).catch(() => null);
    if (hit && (cache !== 'revalidate' || (await stillFresh(url, hit.meta, signal)))) {
      const bytes = await readBlob(hit.file, 'cache', true, onProgress, signal);
      return { bytes, owned: true, fromCache: true };
    }
  }
  return download(url, store, onProgress, signal);
}

/** HEAD request: the server's ETag and Content-Length still match what was cached. */
async function stillFresh(url, meta, signal) {
  try {
    const response = await fetch(url, { method: 'HEAD', signal });
    if (!response.ok) return true; // cannot tell (server down, HEAD not allowed): keep the copy
    const etag = response.headers.get('etag');
    const length = Number(response.headers.get('content-length')) || 0;
    return (!etag || !meta.etag || etag === meta.etag) && (!length || length === meta.size);
  } catch {
    return true; // offline: the cached copy is what we have
  }
}

async function download(url, store, onProgress, signal) {
  let response;
  try {
    response = await fetch(url, { signal });
  } catch (error) {
    checkAborted(signal);
    throw hearthError('network', `could not download the model from ${url} (${error.message}). Check the URL and your connection; a model on another site must allow this page's origin (CORS)`, error);
  }
  if (!response.ok) throw hearthError('network', `fetching the model from ${url} failed: HTTP ${response.status} ${response.statusText}`);
  const total = Number(response.headers.get('content-length')) || 0;
  try {
    checkModelSize(total); // before downloading gigabytes that cannot be loaded
  } catch (error) {
    response.body?.cancel().catch(() => {});
    throw error;
  }
  const meta = { size: total, etag: response.headers.get('etag'), lastModified: response.headers.get('last-modified'), storedAt: Date.now() };

  let warning;
  const skipCache = (error) => {
    if (error instanceof HearthError && error.code === 'quota-exceeded') {
      warning = error;
      return;
    }
    const reason = toHearthError(error);
    const text = reason.message.replace(/^hearth-llm: /, '');
    warning = hearthError(reason.code, `the model could not be cached (${text}); it is loaded without caching and will be downloaded again next time${reason.code === 'quota-exceeded' ? '. Free space with deleteCachedModel(url)' : ''}`, error);
  };
  let writer = null;
  if (store) {
    try {
      const estimate = await navigator.storage?.estimate?.();
      if (estimate && total && estimate.quota - estimate.usage < total) {
        throw new HearthError('quota-exceeded', `hearth-llm: not enough browser storage to cache the model (${mib(total)} needed, ${mib(estimate.quota - estimate.usage)} free); it is loaded without caching and will be downloaded again next time. Free space with deleteCachedModel(url).`);
      }
      writer = await store.writer(url, meta);
    } catch (error) {
      skipCache(error);
    }
  }
  const progress = (loaded) => onProgress?.({ phase: 'download', loaded, total, fromCache: false, cached: Boolean(writer), ...(warning ? { warning } : {}) });

  // One buffer of the announced size: the chunks go to it and to the cache, never held twice.
  let buffer;
  try {
    buffer = new Uint8Array(total || 1 << 20);
  } catch (error) {
    throw hearthError('out-of-memory', `could not allocate ${total} bytes for the model (${error.message})`, error);
  }
  let loaded = 0;
  progress(0);
  const reader = response.body.getReader();
  try {
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
      if (writer) {
        try {
          await writer.write(value);
        } catch (error) {
          skipCache(error);
          await writer.abort().catch(() => {});
          writer = null;
        }
      }
      progress(loaded);
    }
  } catch (error) {
    await writer?.abort().catch(() => {});
    checkAborted(signal);
    throw error instanceof HearthError ? error : hearthError('network', `downloading the model from ${url} failed after ${mib(loaded)} (${error.message})`, error);
  }
  if (writer) {
    try {
      if (total && loaded !== total) throw new Error(`received ${loaded} bytes, Content-Length said ${total}`);
      await writer.commit({ ...meta, size: loaded });
    } catch (error) {
      skipCache(error);
      await writer.abort().catch(() => {});
    }
  }
  const bytes = loaded === buffer.byteLength ? buffer : buffer.slice(0, loaded);
  return { bytes, owned: true, fromCache: false, ...(warning ? { warning } : {}) };
}

function mib(bytes) {
  return `${(bytes / 2 ** 20).toFixed(0)} MiB`;
}
