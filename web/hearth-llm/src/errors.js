// HearthError: every failure the package reports has a stable `code` and a message a user can act on.
//
//   code               when
//   bad-argument       a request or createEngine option is wrong (the message names the field)
//   no-webgpu          backend: 'webgpu' was asked for, but the browser has no WebGPU adapter
//   invalid-model      the file is not a readable GGUF (corrupt, truncated, an HTML error page...)
//   unsupported-model  a valid GGUF hearth cannot run (architecture, tensor type, chat template)
//   context-overflow   the prompt does not fit in the context (nCtx)
//   quota-exceeded     browser storage is full (while caching a model: only reported as a warning)
//   out-of-memory      the browser could not allocate memory for the model
//   device-lost        the GPU device was lost (WebGPU backend)
//   grammar-dead-end   a constrained answer (structured output) cannot go on: no token can continue it
//   aborted            an AbortSignal passed to createEngine or a request fired
//   network            downloading the model failed (HTTP error, offline, CORS)
//   not-loaded         the engine was unloaded
//   busy               the wasm engine was re-entered while generating (a bug in the caller's callbacks)
//   internal           a bug in hearth-llm (please report it with the message)

/** Every code above (index.d.ts declares the same union; tests/browser/types.test.js checks). */
export const ERROR_CODES = ['bad-argument', 'no-webgpu', 'invalid-model', 'unsupported-model', 'context-overflow', 'quota-exceeded', 'out-of-memory', 'device-lost', 'grammar-dead-end', 'aborted', 'network', 'not-loaded', 'busy', 'internal'];

const HINTS = {
  'invalid-model': 'The file is not a valid GGUF model: it may be corrupt or incompletely downloaded. Download it again (deleteCachedModel(url) drops a cached copy).',
  'unsupported-model': 'hearth-llm cannot run this model; try another model or quantization (supported architectures: llama, qwen2, qwen3, gemma3).',
  'context-overflow': 'Shorten the conversation or create the engine with a larger nCtx.',
  'out-of-memory': 'Close other tabs, or use a smaller model or a smaller nCtx.',
  'internal': 'This is a bug in hearth-llm; reloading the page recovers.',
};

export class HearthError extends Error {
  /** @param {string} code one of the codes above @param {string} message */
  constructor(code, message, options) {
    super(message, options);
    this.name = 'HearthError';
    this.code = code;
  }
}

/** A HearthError with `code`, prefixed and with the code's hint appended. */
export function hearthError(code, message, cause) {
  const text = message.startsWith('hearth-llm: ') ? message : `hearth-llm: ${message}`;
  const hint = HINTS[code];
  return new HearthError(code, hint && !text.includes(hint) ? `${text}. ${hint}` : text, cause === undefined ? undefined : { cause });
}

/** Any thrown value → HearthError. Errors from the wasm engine carry a `code` property; traps and
 * allocation failures are classified by type. */
export function toHearthError(error) {
  if (error instanceof HearthError) return error;
  const message = String(error?.message ?? error);
  if (typeof error?.code === 'string' && error.code) return withParam(hearthError(error.code, message, error), error.param);
  if (error?.name === 'AbortError') return hearthError('aborted', 'the operation was aborted', error);
  if (error?.name === 'QuotaExceededError') return hearthError('quota-exceeded', `browser storage is full: ${message}`, error);
  if (/allocation failed|out of memory|could not allocate|memory access out of bounds|grow/i.test(message)) {
    return hearthError('out-of-memory', `the browser ran out of memory for the model (${message})`, error);
  }
  if (error?.name === 'RuntimeError') return hearthError('internal', `the engine crashed (WebAssembly trap: ${message})`, error);
  return hearthError('internal', message, error);
}

/** A refused request parameter, named as the engine named it. */
function withParam(error, param) {
  if (typeof param === 'string' && param) error.param = param;
  return error;
}

/** Rebuilds a HearthError sent from the worker as { name, code, message, param }. */
export function fromWorkerMessage({ code, message, name, param }) {
  if (code) return withParam(new HearthError(code, message), param);
  return toHearthError(Object.assign(new Error(message), { name }));
}

/** The wasm32 engine copies the model into its memory, which cannot exceed 4 GiB. */
export const MAX_MODEL_BYTES = 2 ** 32 - 2 ** 26;

export function checkModelSize(bytes) {
  if (bytes > MAX_MODEL_BYTES) {
    throw hearthError('out-of-memory', `the model is ${(bytes / 2 ** 30).toFixed(2)} GiB, but the WebAssembly engine can hold at most ${(MAX_MODEL_BYTES / 2 ** 30).toFixed(2)} GiB (a wasm32 memory)`);
  }
}
