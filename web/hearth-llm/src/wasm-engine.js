// The wasm engine behind a small async interface shared by the same-thread mode and worker.js:
//   load(model, { backend: 'auto'|'webgpu'|'cpu', ...engine options }, onProgress)
//     model: bytes, or a streamed source { blob } | { url, size } (worker only, range-reader.js)
//   generate(prompt, options, onChunk, shouldStop) → report
//   unload() · stats()
// `prompt` is a string (raw completion) or an array of chat messages; `options` uses the OpenAI
// names the Rust side accepts (see crates/hearth-wasm/src/request.rs).

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
    await this.#engine.load(input, JSON.stringify(engineOptions), backend, (loaded, total) => onProgress?.({ phase: 'load', loaded, total }));
  }

  async generate(prompt, options, onChunk, shouldStop) {
    if (!this.#engine) throw hearthError('not-loaded', 'no model is loaded; call load() first');
    const report = await this.#engine.generate(JSON.stringify(prompt), JSON.stringify(options), (text) => {
      onChunk(text);
      return !shouldStop();
    });
    return JSON.parse(report);
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
    return JSON.parse(this.#engine.runtime_stats());
  }
}
