// The wasm engine behind a small async interface shared by the same-thread mode and worker.js:
//   load(model, { backend: 'auto'|'webgpu'|'cpu', ...engine options }, onProgress)
//     model: bytes, or a streamed source { blob } | { url, size } (worker only, range-reader.js)
//   loadDraft(model, backend, onProgress)  (a draft model for speculative requests; model as in load,
//     backend: 'auto'|'webgpu'|'cpu')
//   generate(kind, request, onChunk, key) → reports, one per choice (concurrent calls run as one batch;
//     kind: 'chat' | 'text'; onChunk(text, choice, toolCall?): toolCall is a piece of a tool call,
//     {index, name} when it starts, {index, arguments} as they stream)
//   cancel(key) · interrupt() · unload() · stats() · loseDeviceForTest()
// `request` is the OpenAI request object (a string `prompt`, or `messages`); it crosses into wasm as
// a JS object, decoded into the core's request schema (crates/hearth-wasm/src/js.rs), and the
// report and stats come back as objects.

import init, { WasmEngine } from './hearth_wasm.js';
import { hearthError } from './errors.js';
import { isLazySource, openReader } from './range-reader.js';

let ready = null;

function initialize() {
  ready ??= init({ module_or_path: new URL('./hearth_wasm_bg.wasm', import.meta.url) });
  return ready;
}

export class LocalEngine {
  #engine = null;

  async load(model, options, onProgress) {
    await initialize();
    this.#engine ??= new WasmEngine();
    const { backend = 'auto', ...engineOptions } = options ?? {};
    // WebGPU: the engine reads the model tensor by tensor into GPU buffers, from bytes that stay in
    // JS memory or through a range reader; the CPU engine copies it into wasm memory.
    const input = isLazySource(model) ? openReader(model) : model;
    await this.#engine.load(input, engineOptions, backend, (loaded, total) => onProgress?.({ phase: 'load', loaded, total }));
  }

  async loadDraft(model, backend, onProgress) {
    if (!this.#engine) throw hearthError('not-loaded', 'no model is loaded; call load() first');
    const input = isLazySource(model) ? openReader(model) : model;
    await this.#engine.load_draft(input, backend ?? 'auto', (loaded, total) => onProgress?.({ phase: 'load', loaded, total }));
  }

  /** `onChunk(text, choice)` returning false cancels; `key` names the request for cancel(key).
   * Resolves to the reports of the request's choices (`n`), in choice order. */
  async generate(kind, request, onChunk, key) {
    if (!this.#engine) throw hearthError('not-loaded', 'no model is loaded; call load() first');
    return this.#engine.generate(kind, request, (text, choice, toolCall) => onChunk(text, choice, toolCall) !== false, key);
  }

  cancel(key) {
    this.#engine?.cancel(key);
  }

  interrupt() {
    this.#engine?.interrupt();
  }

  loseDeviceForTest() {
    return this.#engine?.lose_device_for_test() ?? false;
  }

  async unload() {
    if (this.#engine) {
      this.#engine.unload();
      this.#engine.free();
      this.#engine = null;
    }
  }

  async stats() {
    await initialize();
    if (!this.#engine) return { backend: 'cpu-wasm', model: null };
    return this.#engine.runtime_stats();
  }
}
