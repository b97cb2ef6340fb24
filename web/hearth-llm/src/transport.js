// Where the engine runs: in a dedicated worker (default) or on the calling thread. Both expose
// the LocalEngine interface: load · loadDraft · generate · cancel · interrupt · unload · stats.

import { LocalEngine } from './wasm-engine.js';
import { fromWorkerMessage, hearthError } from './errors.js';

export class WorkerEngine {
  #worker;
  #nextId = 1;
  #pending = new Map();

  constructor() {
    this.#worker = new Worker(new URL('./worker.js', import.meta.url), { type: 'module', name: 'hearth-llm' });
    this.#worker.onmessage = (event) => {
      const { id, type } = event.data;
      const request = this.#pending.get(id);
      if (!request) return;
      if (type === 'progress') request.onProgress?.(event.data.progress);
      else if (type === 'chunk') request.onChunk?.(event.data.text, event.data.choice, event.data.toolCall);
      else {
        this.#pending.delete(id);
        if (type === 'done') request.resolve(event.data.result);
        else request.reject(fromWorkerMessage(event.data));
      }
    };
    this.#worker.onerror = (event) => {
      const error = hearthError('internal', `the worker failed: ${event.message ?? 'could not start (is worker.js served next to index.js?)'}`);
      for (const request of this.#pending.values()) request.reject(error);
      this.#pending.clear();
    };
  }

  #call(message, handlers = {}, transfer = []) {
    const id = this.#nextId++;
    return new Promise((resolve, reject) => {
      this.#pending.set(id, { resolve, reject, ...handlers });
      this.#worker.postMessage({ id, ...message }, transfer);
    });
  }

  /** `model`: bytes, or a streamed source ({ blob } | { url, size }, see range-reader.js) that the
   * worker reads range by range. `owned`: the bytes were fetched or read by us, so their buffer
   * moves to the worker uncopied. */
  load(model, options, onProgress, owned = false) {
    const bytes = model instanceof Uint8Array ? model : null;
    const transfer = bytes && owned && bytes.byteOffset === 0 && bytes.byteLength === bytes.buffer.byteLength ? [bytes.buffer] : [];
    return this.#call({ type: 'load', model, options }, { onProgress }, transfer);
  }

  /** `model`: as in load(); `backend`: 'auto' | 'webgpu' | 'cpu'. */
  loadDraft(model, backend, onProgress, owned = false) {
    const bytes = model instanceof Uint8Array ? model : null;
    const transfer = bytes && owned && bytes.byteOffset === 0 && bytes.byteLength === bytes.buffer.byteLength ? [bytes.buffer] : [];
    return this.#call({ type: 'load-draft', model, backend }, { onProgress }, transfer);
  }

  /** Resolves to the choices' reports; `key` (unique per request) names it for cancel(key). */
  generate(kind, request, onChunk, key) {
    return this.#call({ type: 'generate', kind, request, key }, { onChunk });
  }

  cancel(key) {
    this.#worker.postMessage({ type: 'cancel', key });
  }

  interrupt() {
    this.#worker.postMessage({ type: 'interrupt' });
  }

  loseDeviceForTest() {
    return this.#call({ type: 'lose-device-for-test' });
  }

  unload() {
    return this.#call({ type: 'unload' });
  }

  stats() {
    return this.#call({ type: 'stats' });
  }

  terminate() {
    this.#worker.terminate();
  }
}

export { LocalEngine };
