// Synchronous range readers over a model file the worker does not hold in memory, for the WebGPU
// loader: it copies one range at a time (a header window, then each tensor in 16 MiB pieces)
// straight into GPU buffers, so a URL or File load never holds the whole file anywhere.
//   { blob }      a File/Blob, or the OPFS-cached copy of a URL: FileReaderSync over blob.slice()
//   { url, size } HTTP range requests (synchronous XMLHttpRequest, allowed in workers)
// Both are worker-only APIs: the page thread (worker: false) always gets the bytes in memory.
// A reader is { byteLength, readAt(offset, length) → Uint8Array }; crates/hearth-wasm/src/source.rs
// calls it.

import { hearthError } from './errors.js';

// Small reads (GGUF header, metadata, tensor infos: thousands of reads of a few bytes) are served
// from aligned pages, so they cost a few requests, not thousands.
const PAGE_BYTES = 1 << 20;
const PAGES_KEPT = 4;

/** A descriptor posted to the worker instead of bytes: `{ blob }` or `{ url, size }`. */
export function isLazySource(model) {
  return model !== null && typeof model === 'object' && !(model instanceof Uint8Array) && ('blob' in model || 'url' in model);
}

export function openReader(source) {
  if (typeof FileReaderSync === 'undefined' || typeof XMLHttpRequest === 'undefined') {
    throw hearthError('internal', 'a streamed model source needs a worker (FileReaderSync and XMLHttpRequest)');
  }
  if (source.blob) return pagedReader(source.blob.size, (start, end) => readBlobRange(source.blob, start, end));
  return pagedReader(source.size, (start, end) => readUrlRange(source.url, start, end));
}

function readBlobRange(blob, start, end) {
  try {
    return new Uint8Array(new FileReaderSync().readAsArrayBuffer(blob.slice(start, end)));
  } catch (error) {
    throw hearthError('internal', `could not read bytes ${start}-${end} of the model file (${error.message}); was the file changed or deleted?`, error);
  }
}

function readUrlRange(url, start, end) {
  const request = new XMLHttpRequest();
  request.open('GET', url, false);
  request.setRequestHeader('Range', `bytes=${start}-${end - 1}`);
  request.responseType = 'arraybuffer';
  try {
    request.send();
  } catch (error) {
    throw hearthError('network', `could not read bytes ${start}-${end} of the model from ${url} (${error.message})`, error);
  }
  if (request.status !== 206) {
    throw hearthError('network', `range request for bytes ${start}-${end} of ${url} failed: HTTP ${request.status} ${request.statusText} (the server must answer Range requests with 206)`);
  }
  const bytes = new Uint8Array(request.response);
  if (bytes.byteLength !== end - start) {
    throw hearthError('network', `range request for bytes ${start}-${end} of ${url} returned ${bytes.byteLength} bytes; did the file change on the server?`);
  }
  return bytes;
}

function pagedReader(byteLength, readRange) {
  const pages = new Map(); // page index → bytes; Map order = least recently used first
  const page = (index) => {
    let bytes = pages.get(index);
    if (bytes) {
      pages.delete(index);
    } else {
      const start = index * PAGE_BYTES;
      bytes = readRange(start, Math.min(start + PAGE_BYTES, byteLength));
      if (pages.size >= PAGES_KEPT) pages.delete(pages.keys().next().value);
    }
    pages.set(index, bytes);
    return bytes;
  };
  return {
    byteLength,
    readAt(offset, length) {
      if (offset < 0 || length < 0 || offset + length > byteLength) {
        throw hearthError('invalid-model', `read of ${length} bytes at ${offset} is past the end of the ${byteLength}-byte model file`);
      }
      if (length >= PAGE_BYTES) return readRange(offset, offset + length);
      const out = new Uint8Array(length);
      for (let done = 0; done < length; ) {
        const at = offset + done;
        const bytes = page(Math.floor(at / PAGE_BYTES));
        const within = at % PAGE_BYTES;
        const take = Math.min(length - done, bytes.byteLength - within);
        out.set(bytes.subarray(within, within + take), done);
        done += take;
      }
      return out;
    },
  };
}
