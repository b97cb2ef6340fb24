// Dedicated Web Worker hosting the wasm engine, so generation never blocks the page.
// Protocol (generate calls may overlap: the engine batches them and yields to this event loop
// between steps, so 'cancel' messages arrive while they run):
//   page → worker: { id, type: 'load', model, options } (model: bytes, or { blob } | { url, size })
//                  | { id, type: 'load-draft', model, backend } (model as in 'load'; backend: 'auto' | 'webgpu' | 'cpu')
//                  | { id, type: 'generate', kind, request, key } | { type: 'cancel', key } (key: unique per request)
//                  | { type: 'interrupt' } | { id, type: 'unload' } | { id, type: 'stats' } | { id, type: 'lose-device-for-test' }
//   worker → page: { id, type: 'progress', progress } | { id, type: 'chunk', text, choice, toolCall }
//                  | { id, type: 'done', result } | { id, type: 'error', name, code, message } (a HearthError)

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
    } else if (type === 'load-draft') {
      await engine.loadDraft(event.data.model, event.data.backend, (progress) => reply({ type: 'progress', progress }));
    } else if (type === 'generate') {
      result = await engine.generate(event.data.kind, event.data.request, (text, choice, toolCall) => reply({ type: 'chunk', text, choice, toolCall }), event.data.key);
    } else if (type === 'cancel') {
      engine.cancel(event.data.key);
      return;
    } else if (type === 'interrupt') {
      engine.interrupt();
      return;
    } else if (type === 'lose-device-for-test') {
      result = engine.loseDeviceForTest();
    } else if (type === 'unload') {
      await engine.unload();
    } else if (type === 'stats') {
      result = await engine.stats();
    } else {
      throw new TypeError(`unknown message type '${type}'`);
    }
    reply({ type: 'done', result });
  } catch (error) {
    const { code, message, param } = toHearthError(error);
    reply({ type: 'error', name: 'HearthError', code, message, param });
  }
};
