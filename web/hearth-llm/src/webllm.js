// hearth-llm/webllm: WebLLM's API over hearth-llm, for a one-line migration of apps written
// against @mlc-ai/web-llm:
//
//   import * as webllm from 'hearth-llm/webllm';   // was: from '@mlc-ai/web-llm'
//   const engine = await webllm.CreateMLCEngine('Qwen2.5-1.5B-Instruct-Q4_K_M-GGUF', { initProgressCallback });
//
// Models are GGUF files: a model id is looked up in `appConfig.model_list` (records whose `model`
// is a GGUF URL; `prebuiltAppConfig` by default), or is itself a GGUF URL. An MLC model id whose
// model exists as a GGUF in `prebuiltAppConfig` loads that GGUF; other MLC ids fail with
// ModelNotFoundError. Requests are hearth-llm's (the OpenAI shapes WebLLM also takes, plus tools
// on any model whose chat template has a tool-call format); answers add WebLLM's `usage.extra`,
// and `usage.prompt_tokens` counts the prompt tokens prefilled, as WebLLM's does (a prefix kept
// from an earlier round is not counted).

import { createEngine } from './index.js';
import { HearthError, hearthError, toHearthError, fromWorkerMessage } from './errors.js';
import { listCachedModels, deleteCachedModel, absoluteUrl } from './cache.js';

export { HearthError };

/** WebLLM's names for its model libraries: GGUF records have none (kept so code building
 * `model_lib` strings from them runs). */
export const modelVersion = 'hearth-gguf';
export const modelLibURLPrefix = '';

const gguf = (model_id, model, context_window_size = 4096) => ({ model, model_id, model_lib: '', overrides: { context_window_size } });

/** Models hearth-llm runs, by id, as GGUF files on Hugging Face. */
export const prebuiltAppConfig = {
  model_list: [
    gguf('Qwen2.5-0.5B-Instruct-Q4_K_M-GGUF', 'https://huggingface.co/Qwen/Qwen2.5-0.5B-Instruct-GGUF/resolve/main/qwen2.5-0.5b-instruct-q4_k_m.gguf'),
    gguf('Qwen2.5-1.5B-Instruct-Q4_K_M-GGUF', 'https://huggingface.co/Qwen/Qwen2.5-1.5B-Instruct-GGUF/resolve/main/qwen2.5-1.5b-instruct-q4_k_m.gguf'),
    gguf('Qwen2.5-3B-Instruct-Q4_K_M-GGUF', 'https://huggingface.co/Qwen/Qwen2.5-3B-Instruct-GGUF/resolve/main/qwen2.5-3b-instruct-q4_k_m.gguf'),
    gguf('Qwen2.5-Coder-0.5B-Instruct-Q4_K_M-GGUF', 'https://huggingface.co/Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF/resolve/main/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf'),
    gguf('Qwen2.5-Coder-1.5B-Instruct-Q4_K_M-GGUF', 'https://huggingface.co/Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF/resolve/main/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf'),
    gguf('Llama-3.2-1B-Instruct-Q4_K_M-GGUF', 'https://huggingface.co/bartowski/Llama-3.2-1B-Instruct-GGUF/resolve/main/Llama-3.2-1B-Instruct-Q4_K_M.gguf'),
    gguf('Llama-3.2-3B-Instruct-Q4_K_M-GGUF', 'https://huggingface.co/bartowski/Llama-3.2-3B-Instruct-GGUF/resolve/main/Llama-3.2-3B-Instruct-Q4_K_M.gguf'),
    gguf('Llama-3.1-8B-Instruct-Q4_K_M-GGUF', 'https://huggingface.co/bartowski/Meta-Llama-3.1-8B-Instruct-GGUF/resolve/main/Meta-Llama-3.1-8B-Instruct-Q4_K_M.gguf'),
    gguf('Hermes-2-Pro-Llama-3-8B-Q4_K_M-GGUF', 'https://huggingface.co/NousResearch/Hermes-2-Pro-Llama-3-8B-GGUF/resolve/main/Hermes-2-Pro-Llama-3-8B-Q4_K_M.gguf'),
    gguf('gemma-3-1b-it-Q4_K_M-GGUF', 'https://huggingface.co/ggml-org/gemma-3-1b-it-GGUF/resolve/main/gemma-3-1b-it-Q4_K_M.gguf'),
  ],
};

/** WebLLM's MLC model ids (`<model>-q4f16_1-MLC`, `-q4f32_1-MLC`, `-q0f16-MLC`, ...) of the
 * models above: the part before the quantization names the GGUF record. */
const MLC_ID = /^(.+?)-q\d+f\d+(?:_\d+)?(?:-1k)?-MLC$/;

export class ModelNotFoundError extends HearthError {
  constructor(modelId) {
    super('bad-argument', `hearth-llm: Cannot find model record in appConfig for ${modelId}. hearth-llm runs GGUF models: use an id of prebuiltAppConfig (${prebuiltAppConfig.model_list.map((r) => r.model_id).join(', ')}), add { model_id, model: '<GGUF URL>' } to appConfig.model_list, or pass a GGUF URL as the model id`);
    this.name = 'ModelNotFoundError';
    this.param = 'modelId';
  }
}

export class ModelNotLoadedError extends HearthError {
  constructor(what) {
    super('not-loaded', `hearth-llm: ${what}: no model is loaded; call reload(modelId) (or CreateMLCEngine) first`);
    this.name = 'ModelNotLoadedError';
  }
}

const unsupported = (what, why) => hearthError('bad-argument', `${what} is not supported by hearth-llm: ${why}`);

/** Where a model id's GGUF is: `{ url, overrides }`. */
function resolveModel(modelId, appConfig) {
  if (typeof modelId !== 'string' || !modelId) throw hearthError('bad-argument', `reload: the model id must be a non-empty string, got ${JSON.stringify(modelId)}`);
  const list = appConfig?.model_list ?? [];
  const record = list.find((r) => r.model_id === modelId) ?? prebuiltAppConfig.model_list.find((r) => r.model_id === modelId);
  if (record) {
    if (!isGgufUrl(record.model)) {
      throw hearthError('unsupported-model', `the record of ${modelId} in appConfig.model_list points at MLC-compiled weights (${record.model}); hearth-llm runs GGUF files: set its \`model\` to a .gguf URL`);
    }
    return { url: record.model, overrides: record.overrides ?? {} };
  }
  if (isGgufUrl(modelId) || /^(https?:|blob:|\/|\.\.?\/)/.test(modelId)) return { url: modelId, overrides: {} };
  const mlc = MLC_ID.exec(modelId);
  const counterpart = mlc && prebuiltAppConfig.model_list.find((r) => r.model_id.replace(/-Q\d_K_M-GGUF$/, '') === mlc[1]);
  if (counterpart) {
    console.info(`hearth-llm: ${modelId} loads ${counterpart.model_id} (the same model as a GGUF file)`);
    return { url: counterpart.model, overrides: counterpart.overrides ?? {} };
  }
  throw new ModelNotFoundError(modelId);
}

function isGgufUrl(url) {
  if (typeof url !== 'string') return false;
  try {
    return /\.gguf$/i.test(new URL(url, 'http://x/').pathname);
  } catch {
    return false;
  }
}

/** WebLLM's chat options hearth-llm applies: the context size when loading, sampling defaults
 * for every request. */
const CHAT_OPTION_DEFAULTS = ['temperature', 'top_p', 'repetition_penalty', 'frequency_penalty', 'presence_penalty'];

function loadOptions(modelId, overrides, chatOpts) {
  const options = { ...overrides, ...(chatOpts ?? {}) };
  const defaults = {};
  let nCtx = 0;
  for (const [key, value] of Object.entries(options)) {
    if (value === undefined) continue;
    if (key === 'context_window_size') {
      if (value !== -1) nCtx = value;
    } else if (CHAT_OPTION_DEFAULTS.includes(key)) {
      defaults[key] = value;
    } else if ((key === 'sliding_window_size' || key === 'attention_sink_size') && value === -1) {
      // WebLLM's "off"
    } else {
      throw unsupported(`chat option \`${key}\` (for ${modelId})`, 'hearth-llm reads the model\'s configuration, chat template and tokenizer from its GGUF file');
    }
  }
  if (!Number.isInteger(nCtx) || nCtx < 0) throw hearthError('bad-argument', `chat option context_window_size must be a positive integer, got ${JSON.stringify(nCtx)}`);
  return { nCtx, defaults };
}

/** A byte count for progress texts. */
const megabytes = (bytes) => `${(bytes / 2 ** 20).toFixed(0)}MB`;

/** hearth-llm's progress events as WebLLM's `{ progress, timeElapsed, text }`: downloading or
 * reading the file is the first 80%, loading it into the engine the rest. */
function progressReporter(callback, started) {
  if (!callback) return undefined;
  return ({ phase, loaded = 0, total = 0, fromCache }) => {
    const fraction = total ? loaded / total : 0;
    const timeElapsed = Math.round((performance.now() - started) / 1000);
    const done = `${Math.floor(fraction * 100)}% completed, ${timeElapsed} secs elapsed.`;
    let report;
    if (phase === 'load') report = { progress: 0.8 + 0.2 * fraction, text: `Loading model into the engine: ${done}` };
    else if (phase === 'ready') return;
    else report = { progress: 0.8 * fraction, text: `${phase === 'download' ? 'Fetching' : fromCache ? 'Reading cached' : 'Reading'} model: ${megabytes(loaded)} of ${megabytes(total)}. ${done}` };
    try {
      callback({ ...report, timeElapsed });
    } catch (error) {
      console.error('hearth-llm: initProgressCallback threw', error);
    }
  };
}

const LOG_LEVELS = ['TRACE', 'DEBUG', 'INFO', 'WARN', 'ERROR', 'SILENT'];

/** WebLLM's MLCEngine: one or more loaded models, OpenAI-shaped requests. */
export class MLCEngine {
  #appConfig;
  #progress;
  #hearthOptions;
  #loaded = new Map(); // model id → { engine, defaults }
  #loading = null; // the AbortController of a reload in progress
  #lastMessage = '';
  #stats = { prefillTokens: 0, prefillSeconds: 0, decodeTokens: 0, decodeSeconds: 0 };

  /** `engineConfig`: WebLLM's `{ appConfig, initProgressCallback, logLevel }`, and `hearth`:
   * options for createEngine (`backend`, `worker`, `cache`, `maxBatch`). */
  constructor(engineConfig = {}) {
    const { appConfig, initProgressCallback, logLevel, logitProcessorRegistry, hearth = {}, ...rest } = engineConfig ?? {};
    const unknown = Object.keys(rest);
    if (unknown.length) throw hearthError('bad-argument', `MLCEngine: unknown engineConfig field \`${unknown[0]}\``);
    if (logitProcessorRegistry !== undefined && logitProcessorRegistry.size) throw unsupported('logitProcessorRegistry', 'custom logit processors run in JS between steps; use response_format or logit_bias');
    this.setAppConfig(appConfig);
    this.setInitProgressCallback(initProgressCallback);
    if (logLevel !== undefined) this.setLogLevel(logLevel);
    this.#hearthOptions = hearth;
    this.chat = { completions: { create: (request) => this.chatCompletion(request) } };
    this.completions = { create: (request) => this.completion(request) };
    this.embeddings = { create: () => this.embedding() };
  }

  setAppConfig(appConfig) {
    if (appConfig !== undefined && !Array.isArray(appConfig?.model_list)) throw hearthError('bad-argument', 'appConfig must be { model_list: [{ model_id, model: <GGUF URL> }] }');
    this.#appConfig = appConfig ?? prebuiltAppConfig;
  }

  setInitProgressCallback(callback) {
    if (callback !== undefined && typeof callback !== 'function') throw hearthError('bad-argument', 'initProgressCallback must be a function');
    this.#progress = callback;
  }

  getInitProgressCallback() {
    return this.#progress;
  }

  setLogLevel(logLevel) {
    if (!LOG_LEVELS.includes(logLevel)) throw hearthError('bad-argument', `logLevel must be one of ${LOG_LEVELS.join(', ')}`);
  }

  /** Loads `modelId` (or several, each with its `chatOpts`), unloading what was loaded. An
   * unload() while it runs makes it return without loading. */
  async reload(modelId, chatOpts) {
    const ids = Array.isArray(modelId) ? modelId : [modelId];
    const options = Array.isArray(chatOpts) ? chatOpts : ids.map(() => chatOpts);
    if (options.length !== ids.length) throw hearthError('bad-argument', `reload: ${ids.length} model ids but ${options.length} chat options`);
    if (new Set(ids).size !== ids.length) throw hearthError('bad-argument', 'reload: a model id appears twice');
    const resolved = ids.map((id, i) => ({ id, ...resolveModel(id, this.#appConfig), chatOpts: options[i] }));
    await this.unload();
    const controller = new AbortController();
    this.#loading = controller;
    const started = performance.now();
    const onProgress = progressReporter(this.#progress, started);
    try {
      for (const { id, url, overrides, chatOpts: opts } of resolved) {
        const { nCtx, defaults } = loadOptions(id, overrides, opts);
        const engine = await createEngine({ cache: true, ...this.#hearthOptions, model: url, nCtx, signal: controller.signal, onProgress });
        if (controller.signal.aborted) {
          await engine.unload();
          break;
        }
        this.#loaded.set(id, { engine, defaults });
      }
    } catch (error) {
      if (controller.signal.aborted) return; // unload() stopped the load, as WebLLM's does
      await this.unload();
      throw error;
    } finally {
      if (this.#loading === controller) this.#loading = null;
    }
    if (controller.signal.aborted) return;
    const stats = await [...this.#loaded.values()][0].engine.runtimeStats();
    const on = stats.backend === 'webgpu' ? `WebGPU - ${stats.adapter?.description || stats.adapter?.vendor || 'adapter'}` : 'CPU (WebAssembly)';
    this.#progress?.({ progress: 1, timeElapsed: Math.round((performance.now() - started) / 1000), text: `Finish loading on ${on}` });
  }

  /** Stops a reload in progress and frees every loaded model. */
  async unload() {
    this.#loading?.abort(new DOMException('unload() was called', 'AbortError'));
    const loaded = [...this.#loaded.values()];
    this.#loaded.clear();
    await Promise.allSettled(loaded.map(({ engine }) => engine.unload()));
  }

  /** The model a request runs on: its `model`, or the only one loaded. */
  #model(request, what) {
    if (this.#loaded.size === 0) throw new ModelNotLoadedError(what);
    const id = request?.model ?? (this.#loaded.size === 1 ? [...this.#loaded.keys()][0] : undefined);
    if (id === undefined) throw hearthError('bad-argument', `${what}: several models are loaded (${[...this.#loaded.keys()].join(', ')}); name one in \`model\``);
    const loaded = this.#loaded.get(id);
    if (!loaded) throw hearthError('bad-argument', `${what}: model ${id} is not loaded (loaded: ${[...this.#loaded.keys()].join(', ')})`);
    return loaded;
  }

  async chatCompletion(request) {
    return this.#generate(request, 'chat', 'chat.completions.create');
  }

  async completion(request) {
    return this.#generate(request, 'text', 'completions.create');
  }

  async #generate(request, kind, what) {
    if (request === null || typeof request !== 'object') throw hearthError('bad-argument', `${what} expects a request object`);
    const { engine, defaults } = this.#model(request, what);
    const { model, extra_body, ...body } = kind === 'text' ? completionLogprobs(request) : request;
    checkExtraBody(extra_body);
    const started = performance.now();
    const create = kind === 'chat' ? engine.chat.completions : engine.completions;
    const answer = await create.create({ ...defaults, ...body });
    if (!body.stream) {
      const result = this.#finish(answer, started);
      this.#lastMessage = messageText(result.choices.at(-1), kind);
      return result;
    }
    return this.#stream(answer, started, kind, Boolean(body.stream_options?.include_usage));
  }

  /** hearth-llm's stream as WebLLM's: usage only when asked for, in a last chunk of no choices. */
  async *#stream(chunks, started, kind, includeUsage) {
    const texts = new Map();
    this.#lastMessage = '';
    let usage = null;
    let last = null;
    for await (const chunk of chunks) {
      const { usage: chunkUsage, hearth, ...rest } = chunk;
      for (const choice of rest.choices) {
        const text = kind === 'chat' ? choice.delta?.content : choice.text;
        if (text) texts.set(choice.index, (texts.get(choice.index) ?? '') + text);
      }
      this.#lastMessage = texts.get(Math.max(...texts.keys(), 0)) ?? '';
      if (chunkUsage) usage = this.#usage(chunkUsage, hearth, started);
      last = rest;
      yield rest;
    }
    if (includeUsage && usage && last) yield { id: last.id, object: last.object, created: last.created, model: last.model, choices: [], usage };
  }

  /** A whole answer with WebLLM's usage. */
  #finish(answer, started) {
    const { hearth, usage, ...rest } = answer;
    return { ...rest, usage: this.#usage(usage, hearth, started), hearth };
  }

  /** WebLLM's usage: prompt tokens prefilled, and `extra` timings; adds them to the stats. */
  #usage(usage, details, started) {
    const e2e = (performance.now() - started) / 1000;
    const prefilled = usage.prompt_tokens - (details?.prompt_cached ?? 0);
    const ttft = usage.ttft_ms / 1000;
    const decodeSeconds = usage.decode_tok_s > 0 ? usage.completion_tokens / usage.decode_tok_s : 0;
    this.#stats.prefillTokens += prefilled;
    this.#stats.prefillSeconds += prefilled / (usage.prefill_tok_s || Infinity);
    this.#stats.decodeTokens += usage.completion_tokens;
    this.#stats.decodeSeconds += decodeSeconds;
    const extra = {
      e2e_latency_s: e2e,
      prefill_tokens_per_s: usage.prefill_tok_s,
      decode_tokens_per_s: usage.decode_tok_s,
      time_to_first_token_s: ttft,
      time_per_output_token_s: usage.decode_tok_s > 0 ? 1 / usage.decode_tok_s : 0,
      ...(usage.grammar ? { grammar_init_s: usage.grammar.compile_us / 1e6, grammar_per_token_s: usage.grammar.mask_mean_us / 1e6 } : {}),
    };
    return { ...usage, prompt_tokens: prefilled, total_tokens: prefilled + usage.completion_tokens, extra };
  }

  /** Stops the running generations: their answers end with finish_reason 'abort'. */
  interruptGenerate() {
    for (const { engine } of this.#loaded.values()) engine.interrupt();
  }

  /** Forgets the last message and, unless `keepStats`, the speed statistics. (Cached prompt
   * prefixes stay: they only make a repeated prefix faster.) */
  async resetChat(keepStats = false) {
    this.#lastMessage = '';
    if (!keepStats) this.#stats = { prefillTokens: 0, prefillSeconds: 0, decodeTokens: 0, decodeSeconds: 0 };
  }

  /** The text of the last answer (with several choices, the last one's). */
  async getMessage() {
    return this.#lastMessage;
  }

  /** `prefill: X tokens/sec, decoding: Y tokens/sec` since the last resetChat(). */
  async runtimeStatsText() {
    const rate = (tokens, seconds) => (seconds > 0 ? tokens / seconds : 0).toFixed(4);
    const s = this.#stats;
    return `prefill: ${rate(s.prefillTokens, s.prefillSeconds)} tokens/sec, decoding: ${rate(s.decodeTokens, s.decodeSeconds)} tokens/sec`;
  }

  /** hearth-llm's runtime statistics of a loaded model (backend, adapter, memory). */
  async runtimeStats(modelId) {
    return this.#model(modelId === undefined ? {} : { model: modelId }, 'runtimeStats').engine.runtimeStats();
  }

  async getMaxStorageBufferBindingSize() {
    const adapter = await globalThis.navigator?.gpu?.requestAdapter();
    if (!adapter) throw hearthError('no-webgpu', 'this browser has no WebGPU adapter');
    return adapter.limits.maxStorageBufferBindingSize;
  }

  async getGPUVendor() {
    const adapter = await globalThis.navigator?.gpu?.requestAdapter();
    return adapter?.info?.vendor ?? '';
  }

  async embedding() {
    throw unsupported('embeddings', 'hearth-llm runs text-generation models');
  }

  async forwardTokensAndSample() {
    throw unsupported('forwardTokensAndSample', 'use chat.completions.create or completions.create');
  }
}

/** WebLLM's `extra_body`: what hearth-llm does not do is refused. */
function checkExtraBody(extraBody) {
  if (extraBody === undefined || extraBody === null) return;
  for (const [key, value] of Object.entries(extraBody)) {
    if (value === undefined || value === false && key === 'enable_latency_breakdown') continue;
    const error = unsupported(`extra_body.${key}`, key === 'enable_latency_breakdown' ? 'usage.extra has the timings, usage.grammar the mask times' : 'chat template arguments are not passed to the template');
    error.param = `extra_body.${key}`;
    throw error;
  }
}

/** WebLLM's completions ask for log-probabilities as chat does (`logprobs: true`,
 * `top_logprobs: N`); OpenAI's and hearth's as `logprobs: N`. */
function completionLogprobs(request) {
  if (typeof request.logprobs !== 'boolean') return request;
  const { logprobs, top_logprobs, ...rest } = request;
  if (!logprobs && top_logprobs !== undefined) {
    const error = hearthError('bad-argument', 'completions.create: top_logprobs needs logprobs: true');
    error.param = 'top_logprobs';
    throw error;
  }
  return logprobs ? { ...rest, logprobs: top_logprobs ?? 0 } : rest;
}

function messageText(choice, kind) {
  if (!choice) return '';
  return kind === 'chat' ? (choice.message.content ?? '') : choice.text;
}

/** Creates an MLCEngine and loads `modelId`. */
export async function CreateMLCEngine(modelId, engineConfig, chatOpts) {
  const engine = new MLCEngine(engineConfig);
  await engine.reload(modelId, chatOpts);
  return engine;
}

// ---- Web worker: WebWorkerMLCEngineHandler runs an MLCEngine in the app's worker;
// WebWorkerMLCEngine is its proxy on the page. Messages (structured clones):
//   page → worker: { hearthWebLLM: id, method, args }
//   worker → page: { hearthWebLLM: id, kind: 'return', value } | { hearthWebLLM: id, kind: 'chunk', chunk }
//                  | { hearthWebLLM: id, kind: 'throw', error: { name, code, message, param } }
//                  | { hearthWebLLM: 0, kind: 'progress', report }

const PROXIED = ['reload', 'unload', 'chatCompletion', 'completion', 'resetChat', 'getMessage', 'runtimeStatsText', 'runtimeStats', 'getMaxStorageBufferBindingSize', 'getGPUVendor', 'embedding', 'forwardTokensAndSample', 'setAppConfig', 'setLogLevel'];

export class WebWorkerMLCEngineHandler {
  engine;
  #requests = new Map(); // message id → AbortController of a generation

  constructor() {
    // Already in a worker: the engine runs here, not in a worker of its own.
    this.engine = new MLCEngine({ hearth: { worker: false } });
    this.engine.setInitProgressCallback((report) => this.postMessage({ hearthWebLLM: 0, kind: 'progress', report }));
  }

  postMessage(message) {
    globalThis.postMessage(message);
  }

  setLogitProcessorRegistry(registry) {
    if (registry?.size) throw unsupported('logitProcessorRegistry', 'custom logit processors run in JS between steps; use response_format or logit_bias');
  }

  async onmessage(event, onComplete, onError) {
    const { hearthWebLLM: id, method, args = [] } = event.data ?? {};
    if (!id) return;
    const reply = (message) => this.postMessage({ hearthWebLLM: id, ...message });
    try {
      let value;
      if (method === 'interruptGenerate') {
        value = this.engine.interruptGenerate();
      } else if (method === 'abortRequest') {
        this.#requests.get(args[0])?.abort();
      } else if (method === 'setInitProgressCallback' || method === 'hearthOptions') {
        // progress always goes to the page; createEngine options come with reload
      } else if (PROXIED.includes(method)) {
        if (method === 'chatCompletion' || method === 'completion') {
          const controller = new AbortController();
          this.#requests.set(id, controller);
          try {
            const answer = await this.engine[method]({ ...args[0], signal: controller.signal });
            if (args[0]?.stream) {
              for await (const chunk of answer) reply({ kind: 'chunk', chunk });
            } else {
              value = answer;
            }
          } finally {
            this.#requests.delete(id);
          }
        } else {
          value = await this.engine[method](...args);
        }
      } else {
        throw hearthError('bad-argument', `unknown WebLLM engine method '${method}'`);
      }
      reply({ kind: 'return', value });
      onComplete?.(value);
    } catch (caught) {
      const error = toHearthError(caught);
      reply({ kind: 'throw', error: { name: error.name, code: error.code, message: error.message, param: error.param } });
      onError?.(error);
    }
  }
}

/** The page's side of an MLCEngine running in `worker` (whose messages go to a
 * WebWorkerMLCEngineHandler). */
export class WebWorkerMLCEngine {
  #worker;
  #next = 1;
  #pending = new Map(); // id → { resolve, reject, onChunk }
  #progress;

  constructor(worker, engineConfig = {}) {
    const { appConfig, initProgressCallback, logLevel, logitProcessorRegistry, hearth, ...rest } = engineConfig ?? {};
    const unknown = Object.keys(rest);
    if (unknown.length) throw hearthError('bad-argument', `WebWorkerMLCEngine: unknown engineConfig field \`${unknown[0]}\``);
    if (logitProcessorRegistry?.size) throw unsupported('logitProcessorRegistry', 'custom logit processors run in JS between steps; use response_format or logit_bias');
    if (hearth !== undefined) throw hearthError('bad-argument', 'WebWorkerMLCEngine: `hearth` options apply to the engine in the worker; the worker engine always runs in its worker');
    this.#worker = worker;
    this.#progress = initProgressCallback;
    worker.onmessage = (event) => this.#receive(event.data);
    worker.onerror = (event) => {
      const error = hearthError('internal', `the worker failed: ${event.message ?? 'it could not start'}`);
      for (const request of this.#pending.values()) request.reject(error);
      this.#pending.clear();
    };
    this.chat = { completions: { create: (request) => this.chatCompletion(request) } };
    this.completions = { create: (request) => this.completion(request) };
    this.embeddings = { create: () => this.embedding() };
    if (appConfig !== undefined) this.setAppConfig(appConfig);
    if (logLevel !== undefined) this.setLogLevel(logLevel);
  }

  #receive(message) {
    const { hearthWebLLM: id, kind } = message ?? {};
    if (id === 0 && kind === 'progress') {
      try {
        this.#progress?.(message.report);
      } catch (error) {
        console.error('hearth-llm: initProgressCallback threw', error);
      }
      return;
    }
    const request = this.#pending.get(id);
    if (!request) return;
    if (kind === 'chunk') return request.onChunk?.(message.chunk);
    this.#pending.delete(id);
    if (kind === 'return') request.resolve(message.value);
    else {
      const error = fromWorkerMessage(message.error);
      if (message.error.name && message.error.name !== 'HearthError') error.name = message.error.name;
      request.reject(error);
    }
  }

  #call(method, args = [], onChunk) {
    const id = this.#next++;
    const done = new Promise((resolve, reject) => this.#pending.set(id, { resolve, reject, onChunk }));
    this.#worker.postMessage({ hearthWebLLM: id, method, args });
    return { id, done };
  }

  setInitProgressCallback(callback) {
    this.#progress = callback;
  }

  getInitProgressCallback() {
    return this.#progress;
  }

  setAppConfig(appConfig) {
    return this.#call('setAppConfig', [appConfig]).done;
  }

  setLogLevel(logLevel) {
    return this.#call('setLogLevel', [logLevel]).done;
  }

  interruptGenerate() {
    this.#call('interruptGenerate');
  }

  reload(modelId, chatOpts) {
    return this.#call('reload', [modelId, chatOpts]).done;
  }

  unload() {
    return this.#call('unload').done;
  }

  resetChat(keepStats = false) {
    return this.#call('resetChat', [keepStats]).done;
  }

  getMessage() {
    return this.#call('getMessage').done;
  }

  runtimeStatsText() {
    return this.#call('runtimeStatsText').done;
  }

  runtimeStats(modelId) {
    return this.#call('runtimeStats', [modelId]).done;
  }

  getMaxStorageBufferBindingSize() {
    return this.#call('getMaxStorageBufferBindingSize').done;
  }

  getGPUVendor() {
    return this.#call('getGPUVendor').done;
  }

  embedding() {
    return this.#call('embedding').done;
  }

  forwardTokensAndSample() {
    return this.#call('forwardTokensAndSample').done;
  }

  async chatCompletion(request) {
    return this.#generate('chatCompletion', request);
  }

  async completion(request) {
    return this.#generate('completion', request);
  }

  async #generate(method, request) {
    if (request === null || typeof request !== 'object') throw hearthError('bad-argument', `${method} expects a request object`);
    // An AbortSignal cannot cross to the worker: its abort is sent as a message.
    const { signal, ...body } = request;
    if (signal?.aborted) throw hearthError('aborted', 'the request was aborted before it started', signal.reason);
    if (!body.stream) {
      const { id, done } = this.#call(method, [body]);
      const abort = () => this.#call('abortRequest', [id]);
      signal?.addEventListener('abort', abort, { once: true });
      return done.finally(() => signal?.removeEventListener('abort', abort));
    }
    const queue = [];
    let wake = null;
    const { id, done } = this.#call(method, [body], (chunk) => {
      queue.push(chunk);
      wake?.();
    });
    const abort = () => this.#call('abortRequest', [id]);
    signal?.addEventListener('abort', abort, { once: true });
    let finished = false;
    const settled = done.then(() => (finished = true), (error) => {
      finished = true;
      throw error;
    });
    settled.catch(() => {});
    const wakeOnSettle = () => wake?.();
    settled.then(wakeOnSettle, wakeOnSettle);
    const call = this;
    return (async function* chunks() {
      try {
        for (;;) {
          while (queue.length === 0 && !finished) await new Promise((resolve) => (wake = resolve));
          if (queue.length) {
            yield queue.shift();
            continue;
          }
          await settled;
          return;
        }
      } finally {
        signal?.removeEventListener('abort', abort);
        if (!finished) call.#call('abortRequest', [id]);
      }
    })();
  }
}

/** Creates a WebWorkerMLCEngine on `worker` (whose script runs a WebWorkerMLCEngineHandler) and
 * loads `modelId` there. */
export async function CreateWebWorkerMLCEngine(worker, modelId, engineConfig, chatOpts) {
  const engine = new WebWorkerMLCEngine(worker, engineConfig);
  await engine.reload(modelId, chatOpts);
  return engine;
}

/** WebLLM's service-worker and extension engines keep a model across page loads; hearth-llm
 * keeps the model file in OPFS instead: use a WebWorkerMLCEngine. */
const serviceWorker = (name) => () => {
  throw unsupported(name, 'run the engine in a Web Worker (CreateWebWorkerMLCEngine); the model file stays cached in OPFS across page loads');
};
export const CreateServiceWorkerMLCEngine = serviceWorker('CreateServiceWorkerMLCEngine');
export const ServiceWorkerMLCEngineHandler = serviceWorker('ServiceWorkerMLCEngineHandler');
export const CreateExtensionServiceWorkerMLCEngine = serviceWorker('CreateExtensionServiceWorkerMLCEngine');
export const ExtensionServiceWorkerMLCEngineHandler = serviceWorker('ExtensionServiceWorkerMLCEngineHandler');

// ---- The model cache, by model id.

/** Whether the GGUF of `modelId` is in the browser's model cache. */
export async function hasModelInCache(modelId, appConfig) {
  const { url } = resolveModel(modelId, appConfig);
  const cached = await listCachedModels();
  return cached.some((entry) => entry.url === absoluteUrl(url));
}

/** Removes the cached GGUF of `modelId`. */
export async function deleteModelAllInfoInCache(modelId, appConfig) {
  await deleteCachedModel(resolveModel(modelId, appConfig).url);
}

export const deleteModelInCache = deleteModelAllInfoInCache;

/** A GGUF holds its configuration and tokenizer, and there is no model library: nothing to do. */
export async function deleteChatConfigInCache() {}
export async function deleteModelWasmInCache() {}
