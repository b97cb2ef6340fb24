// hearth-llm: local LLM inference in the browser, with an OpenAI/WebLLM-shaped API.
//
//   const engine = await createEngine({ model: url, onProgress, worker: true });
//   for await (const chunk of await engine.chat.completions.create({ messages, stream: true })) ...
//
// Concurrent requests on one engine run as one continuous batch (each joins and leaves the
// running batch between forward passes); `signal` / `interrupt()` cancel and free their memory.

import { readModel } from './model-source.js';
import { LocalEngine, WorkerEngine } from './transport.js';
import { checkRequest } from './request.js';
import { HearthError, hearthError, toHearthError, checkModelSize } from './errors.js';
import { listCachedModels, deleteCachedModel } from './cache.js';

export { HearthError, listCachedModels, deleteCachedModel };

const BACKENDS = ['auto', 'cpu', 'webgpu'];

/**
 * Loads a model and returns an engine. Options: `model` (URL, File/Blob, Uint8Array, ArrayBuffer),
 * `onProgress({ phase: 'download'|'cache'|'read'|'load'|'ready', loaded, total, fromCache, warning? })`,
 * `worker` (default true), `nCtx` (context tokens; default min(training context, 4096)),
 * `cache` (true | false | 'revalidate'; URL models are kept in OPFS), `backend` ('auto' | 'cpu' |
 * 'webgpu'), `signal` (AbortSignal), `maxBatch` (requests evaluated together, default 4),
 * `draftModel` (a second model with the same vocabulary, for requests with
 * `speculative: { mode: 'draft-model' }`; same source types as `model`), `draftBackend` (where the
 * draft runs: 'auto' | 'cpu' | 'webgpu' with the rules of `backend`; default: `backend`'s value, so
 * a draft for a WebGPU model drafts on WebGPU). Failures reject with a HearthError (see errors.js
 * for codes).
 */
export async function createEngine(options) {
  if (options === null || typeof options !== 'object') throw hearthError('bad-argument', 'createEngine: expected an options object like { model: url }');
  const { model, onProgress, worker = true, nCtx = 0, cache = true, backend = 'auto', signal, maxBatch = 4, draftModel, draftBackend = backend } = options;
  if (model === undefined || model === null) throw hearthError('bad-argument', 'createEngine: `model` is required (a URL, File/Blob, Uint8Array or ArrayBuffer)');
  if (onProgress !== undefined && typeof onProgress !== 'function') throw hearthError('bad-argument', 'createEngine: `onProgress` must be a function');
  if (!Number.isInteger(maxBatch) || maxBatch < 1) throw hearthError('bad-argument', `createEngine: \`maxBatch\` must be a positive integer, got ${JSON.stringify(maxBatch)}`);
  if (!Number.isInteger(nCtx) || nCtx < 0) throw hearthError('bad-argument', `createEngine: \`nCtx\` must be a non-negative integer, got ${JSON.stringify(nCtx)}`);
  if (cache !== true && cache !== false && cache !== 'revalidate') throw hearthError('bad-argument', 'createEngine: `cache` must be true, false or \'revalidate\'');
  if (!BACKENDS.includes(backend)) throw hearthError('bad-argument', `createEngine: \`backend\` must be one of ${BACKENDS.map((b) => `'${b}'`).join(', ')}, got ${JSON.stringify(backend)}`);
  if (!BACKENDS.includes(draftBackend)) throw hearthError('bad-argument', `createEngine: \`draftBackend\` must be one of ${BACKENDS.map((b) => `'${b}'`).join(', ')}, got ${JSON.stringify(draftBackend)}`);
  if (signal !== undefined && !(typeof AbortSignal !== 'undefined' && signal instanceof AbortSignal)) throw hearthError('bad-argument', 'createEngine: `signal` must be an AbortSignal');
  if (backend === 'webgpu' || (draftModel != null && draftBackend === 'webgpu')) await requireWebGpu();
  if (signal?.aborted) throw hearthError('aborted', 'createEngine was aborted', signal.reason);
  const useWorker = Boolean(worker) && typeof Worker !== 'undefined';
  // A throwing progress callback is the caller's bug, but must not break the load.
  const report = onProgress && ((progress) => {
    try {
      onProgress(progress);
    } catch (error) {
      console.error('hearth-llm: onProgress threw', error);
    }
  });
  // In a worker a GPU load reads the model range by range (a File, the OPFS-cached copy, or HTTP
  // range requests) straight into GPU buffers: the whole file is never held in memory.
  const streamed = streamsOn(backend, useWorker);
  // Only the wasm CPU engine must hold the model in its (32-bit) memory.
  const sizeLimited = backend !== 'webgpu';
  const opened = await readModel(model, { onProgress: report, cache, signal, streamed, sizeLimited }).catch((error) => {
    throw toHearthError(error);
  });
  const { bytes, source, owned, fromCache, warning } = opened;
  if (warning) console.warn(warning.message);
  if (signal?.aborted) throw hearthError('aborted', 'createEngine was aborted', signal.reason);
  const size = bytes ? bytes.byteLength : opened.size;
  if (sizeLimited) checkModelSize(size);
  const engineBackend = useWorker ? new WorkerEngine() : new LocalEngine();
  try {
    await engineBackend.load(bytes ?? source, { n_ctx: nCtx, max_batch: maxBatch, backend }, report && ((p) => report({ ...p, fromCache })), owned);
    if (draftModel !== undefined && draftModel !== null) {
      // As the model: streamed into GPU buffers on WebGPU, copied into wasm memory on the CPU.
      const draftSizeLimited = draftBackend !== 'webgpu';
      const draft = await readModel(draftModel, { onProgress: report, cache, signal, streamed: streamsOn(draftBackend, useWorker), sizeLimited: draftSizeLimited });
      if (draftSizeLimited) checkModelSize(draft.bytes ? draft.bytes.byteLength : draft.size);
      await engineBackend.loadDraft(draft.bytes ?? draft.source, draftBackend, report && ((p) => report({ ...p, fromCache: draft.fromCache })), draft.owned);
    }
  } catch (error) {
    engineBackend.terminate?.();
    throw toHearthError(error);
  }
  report?.({ phase: 'ready', loaded: size, total: size, fromCache, ...(warning ? { warning } : {}) });
  const engine = new Engine(engineBackend, useWorker, typeof model === 'string' ? model : (model?.name ?? 'local-model'));
  engine.fromCache = fromCache;
  engine.warnings = warning ? [warning] : [];
  return engine;
}

/** Whether a model for `backend` is read range by range (in a worker, for a GPU backend). */
function streamsOn(backend, useWorker) {
  return useWorker && (backend === 'webgpu' || (backend === 'auto' && Boolean(globalThis.navigator?.gpu)));
}

/** backend: 'webgpu' needs an adapter: checked before any download. */
async function requireWebGpu() {
  let adapter = null;
  try {
    adapter = globalThis.navigator?.gpu ? await navigator.gpu.requestAdapter() : null;
  } catch {
    adapter = null;
  }
  if (!adapter) {
    throw hearthError('no-webgpu', `backend 'webgpu' was requested, but this browser has no WebGPU adapter (${globalThis.navigator?.gpu ? 'navigator.gpu.requestAdapter() returned none: no supported GPU or driver, or WebGPU is blocklisted' : 'navigator.gpu is missing: WebGPU is off or unsupported, or the page is not a secure context'}). Use backend: 'cpu' (or 'auto') to run on the CPU in WebAssembly`);
  }
}

let serial = 0;
let requestKeys = 0;

export class Engine {
  #backend;
  #worker;
  #modelName;
  #queue = Promise.resolve();
  #running = new Map(); // key → { interrupt(), done } of each request in flight
  #unloaded = false;

  constructor(backend, worker, modelName) {
    this.#backend = backend;
    this.#worker = worker;
    this.#modelName = modelName;
    this.chat = { completions: { create: (request) => this.#create(request, 'chat') } };
    this.completions = { create: (request) => this.#create(request, 'text') };
  }

  /** Stops every running generation (their streams end with finish_reason 'abort'). */
  interrupt() {
    for (const request of this.#running.values()) request.interrupt();
  }

  /** Frees the model once its requests are cancelled; later calls throw. */
  async unload() {
    this.interrupt();
    this.#unloaded = true;
    await Promise.allSettled([...this.#running.values()].map((r) => r.done));
    await this.#enqueue(async () => {
      await this.#backend.unload();
      this.#backend.terminate?.();
    });
  }

  /** `{ backend: 'webgpu' | 'cpu-wasm', adapter, fallback_reason, simd128, threads, worker, wasm_memory_bytes, backend_memory_bytes, model, batch, draft_model, draft }`. */
  async runtimeStats() {
    this.#checkLoaded();
    const stats = await this.#backend.stats();
    return { ...stats, worker: this.#worker };
  }

  /** Test hook: destroys the WebGPU device (as a GPU reset would) to exercise 'device-lost'. */
  async _loseDeviceForTest() {
    this.#checkLoaded();
    return this.#backend.loseDeviceForTest();
  }

  #checkLoaded() {
    if (this.#unloaded) throw hearthError('not-loaded', 'the engine was unloaded; create a new one with createEngine()');
  }

  /** Runs `task` after every earlier load/unload task. */
  #enqueue(task) {
    const run = this.#queue.then(task);
    this.#queue = run.catch(() => {});
    return run;
  }

  async #create(request, kind) {
    this.#checkLoaded();
    const { request: body, stream, signal } = checkRequest(request, kind);
    if (signal?.aborted) throw hearthError('aborted', 'the request was aborted before it started', signal.reason);
    const id = `${kind === 'chat' ? 'chatcmpl' : 'cmpl'}-hearth-${++serial}`;
    const created = Math.floor(Date.now() / 1000);
    const chunks = new ChunkQueue();
    const done = this.#run(kind, body, signal, chunks);
    const shape = { id, created, model: this.#modelName, kind };
    if (stream) {
      // As a server answers a refused request with an error status before any event, a request
      // the engine refuses rejects here rather than at the stream's first chunk.
      await chunks.started(done);
      return streamChunks(chunks, done, shape);
    }
    const reports = await done.catch((error) => {
      throw toHearthError(error);
    });
    return completionObject(reports, shape);
  }

  async #run(kind, request, signal, chunks) {
    this.#checkLoaded();
    const key = ++requestKeys;
    let stopped = false;
    const interrupt = () => {
      if (stopped) return;
      stopped = true;
      this.#backend.cancel(key);
      chunks.close();
    };
    chunks.interrupt = interrupt;
    signal?.addEventListener('abort', interrupt, { once: true });
    const done = this.#backend.generate(kind, request, (text, choice, toolCall) => {
      chunks.push({ text, choice, toolCall });
      return !stopped;
    }, key);
    this.#running.set(key, { interrupt, done });
    try {
      const reports = await done;
      if (stopped) for (const report of reports) report.finish_reason = 'cancelled';
      return reports;
    } finally {
      signal?.removeEventListener('abort', interrupt);
      this.#running.delete(key);
      chunks.close();
    }
  }
}

/** Text deltas from the engine ({ text, choice }), consumed by the stream iterator. */
class ChunkQueue {
  items = [];
  closed = false;
  wake = null;

  push(delta) {
    if (this.closed) return;
    this.items.push(delta);
    this.wake?.();
    this.onStart?.();
  }

  /** Resolves at the first chunk or when `done` (the request) resolves; rejects when the
   * request fails before its first chunk. */
  started(done) {
    if (this.items.length) return Promise.resolve();
    return new Promise((resolve, reject) => {
      this.onStart = resolve;
      done.then(resolve, (error) => (this.items.length ? resolve() : reject(toHearthError(error))));
    });
  }

  close() {
    this.closed = true;
    this.wake?.();
  }

  async next() {
    while (this.items.length === 0 && !this.closed) await new Promise((resolve) => (this.wake = resolve));
    this.wake = null;
    return this.items.length ? this.items.shift() : null;
  }
}

const FINISH = { stop: 'stop', length: 'length', context_full: 'length', cancelled: 'abort' };

/** The usage of a request's choices: the prompt once (the choices share it), their completion
 * tokens summed; timings are the first choice's. */
function usage(reports) {
  const [first] = reports;
  const completion = reports.reduce((sum, report) => sum + report.completion_tokens, 0);
  const drafted = reports.filter((report) => report.speculative);
  const constrained = reports.filter((report) => report.grammar);
  return {
    prompt_tokens: first.prompt_tokens,
    completion_tokens: completion,
    total_tokens: first.prompt_tokens + completion,
    ttft_ms: first.ttft_ms,
    prefill_tok_s: first.prefill_tok_s,
    decode_tok_s: first.decode_tok_s,
    ...(drafted.length ? { speculative: sumSpeculative(drafted.map((report) => report.speculative)) } : {}),
    ...(constrained.length ? { grammar: sumGrammar(constrained.map((report) => report.grammar)) } : {}),
  };
}

/** Structured output's masks over choices: counts summed, the mean weighed by masks, other
 * times the slowest choice's. */
function sumGrammar(all) {
  if (all.length === 1) return all[0];
  const masks = all.reduce((total, g) => total + g.masks, 0);
  return {
    masks,
    forced_tokens: all.reduce((total, g) => total + g.forced_tokens, 0),
    mask_mean_us: masks ? all.reduce((total, g) => total + g.mask_mean_us * g.masks, 0) / masks : 0,
    mask_p50_us: Math.max(...all.map((g) => g.mask_p50_us)),
    mask_p99_us: Math.max(...all.map((g) => g.mask_p99_us)),
    compile_us: Math.max(...all.map((g) => g.compile_us)),
    full_logits_rows: all.reduce((total, g) => total + g.full_logits_rows, 0),
  };
}

/** Draft counts summed over choices; rates recomputed from the sums. */
function sumSpeculative(all) {
  if (all.length === 1) return all[0];
  const sum = (field) => all.reduce((total, s) => total + s[field], 0);
  const counts = Object.fromEntries(['proposed', 'accepted', 'target_forward_passes', 'free_proposed', 'free_accepted', 'free_passes', 'drafter_prepare_ms'].map((f) => [f, sum(f)]));
  return {
    ...counts,
    acceptance_rate: counts.proposed ? counts.accepted / counts.proposed : 0,
    mean_accepted_per_step: counts.target_forward_passes ? counts.accepted / counts.target_forward_passes : 0,
  };
}

/** Non-standard details (token ids for tests and debugging), kept out of the OpenAI fields: the
 * first choice's, and with several choices each one's ids and seed. */
function details(reports) {
  const [first] = reports;
  return {
    prompt_token_ids: first.prompt_token_ids,
    token_ids: first.token_ids,
    prompt_cached: first.prompt_tokens - first.prompt_evaluated,
    seed: first.seed,
    ...(reports.length > 1 ? { choices: reports.map((report) => ({ token_ids: report.token_ids, seed: report.seed })) } : {}),
  };
}

function chunkObject(shape, index, choice, extra = {}) {
  const object = shape.kind === 'chat' ? 'chat.completion.chunk' : 'text_completion';
  return { id: shape.id, object, created: shape.created, model: shape.model, choices: [{ index, logprobs: null, ...choice }], ...extra };
}

async function* streamChunks(chunks, done, shape) {
  let finished = false;
  const failure = done.then(() => null, (error) => error);
  try {
    yield* deltas();
  } finally {
    // The consumer left the loop early (break/return): stop generating for nobody.
    if (!finished) chunks.interrupt?.();
  }

  async function* deltas() {
  // Choices that have streamed their first delta (chat's first delta carries the role).
  const begun = new Set();
  for (;;) {
    const delta = await chunks.next();
    if (delta === null) break;
    const { text, choice: index, toolCall } = delta;
    const first = !begun.has(index);
    begun.add(index);
    let message = { content: text };
    if (toolCall) {
      // OpenAI's streamed calls: the id, type and name first, then the arguments in pieces.
      const call = toolCall.name !== undefined
        ? { index: toolCall.index, id: callId(shape, index, toolCall.index), type: 'function', function: { name: toolCall.name, arguments: '' } }
        : { index: toolCall.index, function: { arguments: toolCall.arguments } };
      message = { tool_calls: [call] };
    }
    const choice = shape.kind === 'chat' ? { delta: first ? { role: 'assistant', ...message } : message, finish_reason: null } : { text, finish_reason: null };
    yield chunkObject(shape, index, choice);
  }
  const error = await failure;
  if (error) throw toHearthError(error);
  const reports = await done;
  // Each choice ends with a chunk of its finish reason and the log-probabilities of its whole
  // answer; the last one also carries the usage.
  finished = true;
  for (const [index, report] of reports.entries()) {
    const logprobs = report.logprobs ?? null;
    const last = shape.kind === 'chat' ? { delta: {}, logprobs, finish_reason: finishReason(report) } : { text: '', logprobs, finish_reason: FINISH[report.finish_reason] };
    const extra = index === reports.length - 1 ? { usage: usage(reports), hearth: details(reports) } : {};
    yield chunkObject(shape, index, last, extra);
  }
  }
}

/** A tool call's id: the same in a stream and in the whole answer. */
function callId(shape, choice, index) {
  return `call_${shape.id.split('-').at(-1)}_${choice}_${index}`;
}

/** OpenAI's finish reason: 'tool_calls' when an answer that ended by itself holds calls. */
function finishReason(report) {
  return report.tool_calls?.length && report.finish_reason === 'stop' ? 'tool_calls' : FINISH[report.finish_reason];
}

/** A chat answer's message: with tools, its text outside calls and the calls. */
function chatMessage(report, shape, choice) {
  if (!report.tool_calls) return { role: 'assistant', content: report.text };
  const message = { role: 'assistant', content: report.content ?? null };
  if (report.tool_calls.length) {
    message.tool_calls = report.tool_calls.map((call, index) => ({ id: callId(shape, choice, index), type: 'function', function: { name: call.name, arguments: call.arguments } }));
  }
  return message;
}

function completionObject(reports, shape) {
  const choices = reports.map((report, index) => {
    const finish_reason = shape.kind === 'chat' ? finishReason(report) : FINISH[report.finish_reason];
    const choice = shape.kind === 'chat' ? { message: chatMessage(report, shape, index), finish_reason } : { text: report.text, finish_reason };
    return { index, logprobs: report.logprobs ?? null, ...choice };
  });
  const object = shape.kind === 'chat' ? 'chat.completion' : 'text_completion';
  return { id: shape.id, object, created: shape.created, model: shape.model, choices, usage: usage(reports), hearth: details(reports) };
}

