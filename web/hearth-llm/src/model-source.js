// Model bytes from a URL (the model cache first, else fetched with progress and cached while it
// downloads), a File/Blob, or bytes already in memory.
// Returns { bytes: Uint8Array, owned: boolean, fromCache: boolean, warning?: HearthError }
// (owned = we allocated it, so it may be transferred to the worker), or with `streamed` (a worker
// will read the model range by range, see range-reader.js) { source, size, fromCache, warning? }
// where `source` is { blob } (a File/Blob, or the OPFS-cached copy of a URL: a download goes to
// the cache, not to memory) or { url, size } (HTTP range requests, when nothing is cached) — or
// { bytes, ... } as above when the server does not answer Range requests.
//
// Progress events: { phase: 'download' | 'cache' | 'read', loaded, total, fromCache, warning? }.

import { absoluteUrl, openCache } from './cache.js';
import { HearthError, hearthError, toHearthError, checkModelSize } from './errors.js';

/** `cache`: true (default) · false (no cache read or write) · 'revalidate' (HEAD: ETag/length must match). */
/** `streamed`: see the top of the file. `sizeLimited` (default true): a model larger than the wasm
 * CPU engine can hold is rejected before it downloads. */
export async function readModel(model, { onProgress, cache = true, signal, streamed = false, sizeLimited = true } = {}) {
  if (model instanceof Uint8Array) return { bytes: model, owned: false, fromCache: false };
  if (model instanceof ArrayBuffer) return { bytes: new Uint8Array(model), owned: false, fromCache: false };
  if (typeof Blob !== 'undefined' && model instanceof Blob) {
    if (streamed) return { source: { blob: model }, size: model.size, fromCache: false };
    const bytes = await readBlob(model, 'read', false, onProgress, signal);
    return { bytes, owned: true, fromCache: false };
  }
  if (typeof model === 'string' || model instanceof URL) {
    const url = absoluteUrl(model);
    return streamed ? openUrl(url, { onProgress, cache, signal, sizeLimited }) : readUrl(url, { onProgress, cache, signal });
  }
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

/** A URL for a worker that reads ranges: the cached file; else downloaded into the cache (not into
 * memory) and read from there; else HTTP range requests; else, for a server without ranges, the
 * bytes in memory. */
async function openUrl(url, { onProgress, cache, signal, sizeLimited }) {
  const store = cache ? await openCache() : null;
  if (store) {
    const hit = await store.get(url).catch(() => null);
    if (hit && (cache !== 'revalidate' || (await stillFresh(url, hit.meta, signal)))) {
      onProgress?.({ phase: 'cache', loaded: hit.file.size, total: hit.file.size, fromCache: true });
      return { source: { blob: hit.file }, size: hit.file.size, fromCache: true };
    }
    const downloaded = await download(url, store, onProgress, signal, { keepBytes: false, sizeLimited });
    const cached = await store.get(url).catch(() => null);
    if (cached) return { source: { blob: cached.file }, size: cached.file.size, fromCache: false, ...(downloaded.warning ? { warning: downloaded.warning } : {}) };
    // The cache write failed (quota...): the bytes went nowhere; read ranges or download again.
    const ranged = await probeRanges(url, signal);
    if (ranged) return { ...ranged, warning: downloaded.warning };
    return { ...(await download(url, null, onProgress, signal)), warning: downloaded.warning };
  }
  return (await probeRanges(url, signal)) ?? download(url, null, onProgress, signal);
}

/** { source: { url, size }, size } when the server answers a Range request with 206, else null. */
async function probeRanges(url, signal) {
  let response;
  try {
    response = await fetch(url, { headers: { Range: 'bytes=0-0' }, signal });
  } catch (error) {
    checkAborted(signal);
    throw hearthError('network', `could not reach the model at ${url} (${error.message}). Check the URL and your connection; a model on another site must allow this page's origin (CORS)`, error);
  }
  response.body?.cancel().catch(() => {});
  if (response.status === 404 || response.status >= 500) {
    throw hearthError('network', `fetching the model from ${url} failed: HTTP ${response.status} ${response.statusText}`);
  }
  // "bytes 0-0/491400064"; a cross-origin server must also expose Content-Range (CORS).
  const size = Number(/\/(\d+)$/.exec(response.headers.get('content-range') ?? '')?.[1]);
  return response.status === 206 && size > 0 ? { source: { url, size }, size, fromCache: false } : null;
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

/** `keepBytes: false` (with a store): the chunks only go to the cache; returns { warning? }. */
async function download(url, store, onProgress, signal, { keepBytes = true, sizeLimited = true } = {}) {
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
    if (sizeLimited) checkModelSize(total); // before downloading gigabytes that cannot be loaded
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

  if (!keepBytes && !writer) {
    // No cache to stream into: the caller reads ranges (or downloads into memory) instead.
    response.body?.cancel().catch(() => {});
    return warning ? { warning } : {};
  }
  // One buffer of the announced size: the chunks go to it and to the cache, never held twice.
  const keep = keepBytes;
  let buffer;
  try {
    buffer = new Uint8Array(keep ? total || 1 << 20 : 0);
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
      if (keep) {
        if (loaded + value.byteLength > buffer.byteLength) {
          const grown = new Uint8Array(Math.max(buffer.byteLength * 2, loaded + value.byteLength));
          grown.set(buffer.subarray(0, loaded));
          buffer = grown;
        }
        buffer.set(value, loaded);
      }
      loaded += value.byteLength;
      if (writer) {
        try {
          await writer.write(value);
        } catch (error) {
          skipCache(error);
          await writer.abort().catch(() => {});
          writer = null;
          if (!keep) {
            // Nothing keeps these bytes any more: stop downloading (the caller reads ranges instead).
            await reader.cancel().catch(() => {});
            break;
          }
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
  if (!keep) return warning ? { warning } : {};
  const bytes = loaded === buffer.byteLength ? buffer : buffer.slice(0, loaded);
  return { bytes, owned: true, fromCache: false, ...(warning ? { warning } : {}) };
}

function mib(bytes) {
  return `${(bytes / 2 ** 20).toFixed(0)} MiB`;
}
