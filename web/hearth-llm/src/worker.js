// Dedicated Web Worker hosting the wasm engine, so generation never blocks the page.
// Protocol (one request at a time; the page queues):
//   page → worker: { id, type: 'load', model, options } (model: bytes, or { blob } | { url, size }) | { id, type: 'generate', prompt, options, stopFlag? }
//                  | { id, type: 'unload' } | { id, type: 'stats' }
//   worker → page: { id, type: 'progress', progress } | { id, type: 'chunk', text }
//                  | { id, type: 'done', result } | { id, type: 'error', name, code, message } (a HearthError)
// `stopFlag` is an Int32Array on a SharedArrayBuffer (cross-origin isolated pages only): the page
// sets it to 1 to interrupt a running generation, which this synchronous loop cannot otherwise hear.

import { LocalEngine } from './wasm-engine.js';
import { toHearthError } from './errors.js';

const engine = new LocalEngine();

self.onmessage = async (event) => {
  const { id, type } = event.data;
  const reply = (message, transfer) => self.postMessage({ id, ...message }, transfer ?? []);
  try {
    let result = null;
    if (type === 'load') {
      await engine.load(event.data.model, event.data.options, (progress) => reply({ type: 'progress', progress }));
    } else if (type === 'generate') {
      const flag = event.data.stopFlag;
      result = await engine.generate(
        event.data.prompt,
        event.data.options,
        (text) => reply({ type: 'chunk', text }),
        () => (flag ? Atomics.load(flag, 0) !== 0 : false),
      );
    } else if (type === 'unload') {
      await engine.unload();
    } else if (type === 'stats') {
      result = await engine.stats();
    } else {
      throw new TypeError(`unknown message type '${type}'`);
    }
    reply({ type: 'done', result });
  } catch (error) {
    const { code, message } = toHearthError(error);
    reply({ type: 'error', name: 'HearthError', code, message });
  }
};
