// The model cache: GGUF files downloaded from a URL are kept in the Origin Private File System
// (OPFS), or in Cache Storage where OPFS is missing, so the next load of the same URL makes no
// network request. Written chunk by chunk while the download runs (never a second copy in memory).
//
// OPFS layout, under the directory `hearth-llm-models`:
//   <key>.gguf   the bytes, written as they arrive
//   <key>.json   { url, size, etag, lastModified, storedAt }, written only once the file is complete,
//                so an entry without it (a download cut short) is never used
// `key` = hex SHA-256 of the absolute URL. An entry is used only when the file's size equals the
// Content-Length recorded with it; `cache: 'revalidate'` also compares ETag/Content-Length with a HEAD.

const DIRECTORY = 'hearth-llm-models';
const CACHE_NAME = 'hearth-llm-models';

async function keyOf(url) {
  const digest = await crypto.subtle.digest('SHA-256', new TextEncoder().encode(url));
  return [...new Uint8Array(digest)].map((b) => b.toString(16).padStart(2, '0')).join('');
}

async function opfsDirectory() {
  try {
    if (!globalThis.navigator?.storage?.getDirectory) return null;
    // createWritable on OPFS files is what the streaming write needs (not in every browser's window scope).
    if (typeof globalThis.FileSystemFileHandle?.prototype?.createWritable !== 'function') return null;
    const root = await navigator.storage.getDirectory();
    return await root.getDirectoryHandle(DIRECTORY, { create: true });
  } catch {
    return null; // opaque origins, disabled storage, private modes without OPFS
  }
}

class OpfsStore {
  kind = 'opfs';
  constructor(directory) {
    this.directory = directory;
  }

  async #meta(key) {
    try {
      const file = await (await this.directory.getFileHandle(`${key}.json`)).getFile();
      return JSON.parse(await file.text());
    } catch {
      return null;
    }
  }

  /** { file: File, meta } for a complete entry, else null (and a broken one is removed). */
  async get(url) {
    const key = await keyOf(url);
    const meta = await this.#meta(key);
    if (!meta || meta.url !== url) return null;
    try {
      const file = await (await this.directory.getFileHandle(`${key}.gguf`)).getFile();
      if (file.size === meta.size) return { file, meta };
    } catch {
      // fall through: the bytes are gone
    }
    await this.delete(url);
    return null;
  }

  /** A writer for `url`: write(chunk) · commit(meta) · abort(). `meta`: { size, etag, lastModified, storedAt }. */
  async writer(url) {
    const key = await keyOf(url);
    await this.delete(url);
    const handle = await this.directory.getFileHandle(`${key}.gguf`, { create: true });
    const writable = await handle.createWritable({ keepExistingData: false });
    const directory = this.directory;
    return {
      write: (chunk) => writable.write(chunk),
      async commit(meta) {
        await writable.close();
        const metaWritable = await (await directory.getFileHandle(`${key}.json`, { create: true })).createWritable();
        await metaWritable.write(JSON.stringify({ ...meta, url }));
        await metaWritable.close();
      },
      abort: async () => {
        await writable.abort().catch(() => {});
        await this.delete(url);
      },
    };
  }

  async list() {
    const entries = [];
    for await (const [name, handle] of this.directory.entries()) {
      if (!name.endsWith('.json') || handle.kind !== 'file') continue;
      const meta = await this.#meta(name.slice(0, -5));
      if (meta) entries.push({ url: meta.url, size: meta.size, etag: meta.etag ?? null, storedAt: meta.storedAt, storage: 'opfs' });
    }
    return entries;
  }

  async delete(url) {
    const key = await keyOf(url);
    let removed = false;
    for (const name of [`${key}.json`, `${key}.gguf`]) {
      removed = (await this.directory.removeEntry(name).then(() => true, () => false)) || removed;
    }
    return removed;
  }
}

/** Cache Storage fallback: one Response per URL; metadata in its headers. */
class CacheStorageStore {
  kind = 'cache-storage';
  constructor(cache) {
    this.cache = cache;
  }

  async get(url) {
    const response = await this.cache.match(url);
    if (!response) return null;
    const meta = JSON.parse(response.headers.get('x-hearth-meta') ?? 'null');
    const file = await response.blob(); // a disk-backed Blob: no copy in memory until read
    if (meta && file.size === meta.size) return { file, meta };
    await this.cache.delete(url);
    return null;
  }

  /** `meta.size` must be known: the Response's headers are fixed before the body streams in. A
   * body that errors (abort) makes cache.put reject, so a partial file is never stored. */
  async writer(url, meta) {
    if (!meta.size) return null;
    let controller;
    const body = new ReadableStream({ start: (c) => (controller = c) });
    const headers = { 'content-type': 'application/octet-stream', 'x-hearth-meta': JSON.stringify({ ...meta, url }) };
    const put = this.cache.put(url, new Response(body, { headers }));
    let failure = null;
    put.catch((error) => (failure = error));
    return {
      write: async (chunk) => {
        if (failure) throw failure;
        controller.enqueue(chunk);
      },
      commit: async () => {
        controller.close();
        await put;
      },
      abort: async () => {
        try {
          controller.error(new DOMException('cancelled', 'AbortError'));
        } catch {
          // already closed or errored
        }
        await put.catch(() => {});
        await this.cache.delete(url);
      },
    };
  }

  async list() {
    const entries = [];
    for (const request of await this.cache.keys()) {
      const response = await this.cache.match(request);
      const meta = JSON.parse(response?.headers.get('x-hearth-meta') ?? 'null');
      if (meta) entries.push({ url: meta.url, size: meta.size, etag: meta.etag ?? null, storedAt: meta.storedAt, storage: 'cache-storage' });
    }
    return entries;
  }

  async delete(url) {
    return this.cache.delete(url);
  }
}

let opened = null;

/** The store in use (OPFS, else Cache Storage), or null when this page can keep neither. */
export function openCache({ preferOpfs = true } = {}) {
  opened ??= (async () => {
    const directory = preferOpfs ? await opfsDirectory() : null;
    if (directory) return new OpfsStore(directory);
    try {
      if (globalThis.caches) return new CacheStorageStore(await caches.open(CACHE_NAME));
    } catch {
      // Cache Storage needs a secure context
    }
    return null;
  })();
  return opened;
}

/** Test hook: forget the chosen store (e.g. to force the Cache Storage fallback). */
export function resetCacheStore() {
  opened = null;
}

export function absoluteUrl(url) {
  return new URL(String(url), globalThis.location?.href).href;
}

/** [{ url, size, etag, storedAt, storage: 'opfs' | 'cache-storage' }] of complete cached models. */
export async function listCachedModels() {
  const store = await openCache();
  return store ? store.list() : [];
}

/** Removes the cached copy of `url`; resolves to whether there was one. */
export async function deleteCachedModel(url) {
  const store = await openCache();
  return store ? store.delete(absoluteUrl(url)) : false;
}
