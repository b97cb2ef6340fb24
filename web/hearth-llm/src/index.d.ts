// hearth-llm: local LLM inference in the browser with an OpenAI/WebLLM-shaped API.

export type ModelSource = string | URL | Blob | File | Uint8Array | ArrayBuffer;

export type HearthErrorCode =
  | 'bad-argument'
  | 'no-webgpu'
  | 'invalid-model'
  | 'unsupported-model'
  | 'context-overflow'
  | 'quota-exceeded'
  | 'out-of-memory'
  | 'device-lost'
  | 'grammar-dead-end'
  | 'aborted'
  | 'network'
  | 'not-loaded'
  | 'busy'
  | 'internal';

/** Every failure of the package: `code` is stable, `message` says what to do. */
export class HearthError extends Error {
  constructor(code: HearthErrorCode, message: string, options?: { cause?: unknown });
  readonly name: 'HearthError';
  readonly code: HearthErrorCode;
  /** For 'bad-argument' from request validation: the request field that was refused
   * ("temperature", "messages", "speculative", ...). */
  readonly param?: string;
}

export interface Progress {
  /** download: fetching a URL · cache: reading the cached copy · read: reading a File/Blob ·
   * load: weights into the engine · ready. */
  phase: 'download' | 'cache' | 'read' | 'load' | 'ready';
  loaded: number;
  /** 0 when unknown (no Content-Length). */
  total: number;
  /** The model bytes come from the model cache (no network request). */
  fromCache?: boolean;
  /** download phase: the bytes are being written to the cache. */
  cached?: boolean;
  /** Set when caching failed (e.g. code 'quota-exceeded'): the load goes on, uncached. */
  warning?: HearthError;
}

export interface CreateEngineOptions {
  /** In worker mode with a GPU backend ('auto' or 'webgpu') the model is read range by range into
   * GPU buffers and never held whole in memory: a File/Blob is sliced; a URL is downloaded into the
   * cache and read from there, or read with HTTP Range requests when nothing is cached (the server
   * must answer them with 206 and, cross-origin, expose Content-Range). The wasm CPU engine holds
   * the model in its memory. */
  model: ModelSource;
  onProgress?: (progress: Progress) => void;
  /** Run the engine in a dedicated Web Worker (default true). */
  worker?: boolean;
  /** Context size in tokens (default: min(training context, 4096)). */
  nCtx?: number;
  /** URL models: keep them in OPFS (Cache Storage fallback) and reuse without a request (default true);
   * false: neither read nor write the cache; 'revalidate': reuse only if a HEAD's ETag/Content-Length match. */
  cache?: boolean | 'revalidate';
  /** 'auto' (default): WebGPU when a device opens on a hardware adapter, else the WebAssembly CPU
   * engine (`runtimeStats().fallback_reason` says why: no adapter, or a software one such as
   * SwiftShader, which is slower than the CPU engine). 'webgpu': rejects with code 'no-webgpu' when the
   * browser has no adapter. 'cpu': the WebAssembly CPU engine. */
  backend?: 'auto' | 'cpu' | 'webgpu';
  /** Aborts the download / cache read (rejects with code 'aborted'). */
  signal?: AbortSignal;
  /** Requests evaluated together in one forward pass (default 4); more wait their turn. */
  maxBatch?: number;
  /** A draft model with the same vocabulary as `model` (rejects with 'bad-argument' otherwise),
   * for requests with `speculative: { mode: 'draft-model' }`. It runs where `draftBackend` says,
   * read like `model` (streamed into GPU buffers on WebGPU, copied into wasm memory on the CPU). */
  draftModel?: ModelSource;
  /** Where the draft model runs, with the rules of `backend` (default: the value of `backend`, so
   * a draft for a model on WebGPU drafts on WebGPU, on a device of its own, its passes awaited like
   * the model's). 'cpu' drafts on the WebAssembly CPU engine while the model runs on WebGPU.
   * `runtimeStats().draft` says where it runs. */
  draftBackend?: 'auto' | 'cpu' | 'webgpu';
}

export interface CachedModel {
  /** Absolute URL the model was downloaded from (the cache key). */
  url: string;
  size: number;
  etag: string | null;
  /** ms since the epoch. */
  storedAt: number;
  storage: 'opfs' | 'cache-storage';
}

/** Complete cached models of this origin. */
export function listCachedModels(): Promise<CachedModel[]>;
/** Removes the cached copy of `url` (relative URLs resolve against the page); resolves to whether one existed. */
export function deleteCachedModel(url: string | URL): Promise<boolean>;

/** The fields hearth checks as `hearth serve` does (docs/REQUESTS.md has every range and default);
 * a field it does not implement is refused with 'bad-argument', never ignored. */
export interface SamplingRequest {
  /** 0..2 (default 1; 0 is greedy). */
  temperature?: number;
  top_p?: number;
  top_k?: number;
  min_p?: number;
  max_tokens?: number;
  max_completion_tokens?: number;
  seed?: number;
  stop?: string | string[];
  presence_penalty?: number;
  frequency_penalty?: number;
  /** Also accepted as `repeat_penalty`. */
  repetition_penalty?: number;
  /** How many recent tokens the penalties look at: -1 (default) the whole history, 0 none. */
  repeat_last_n?: number;
  /** Token id → bias in -100..100. */
  logit_bias?: Record<string, number>;
  ignore_eos?: boolean;
  /** Accepted (hearth-llm's last chunk always carries the usage). */
  stream_options?: { include_usage?: boolean };
  /** OpenAI's predicted outputs: text the answer is expected to repeat (drafts are copied from it). */
  prediction?: { type: 'content'; content: string | { type: 'text'; text: string }[] };
  user?: string;
  /** Speculative decoding (greedy output is unchanged; sampling keeps the target's distribution),
   * as `hearth run --lookup` / `--draft-model` / `--draft-tokens K`, on the WebGPU or the CPU
   * engine. Batched with other requests, each verifying its drafts in the shared pass. */
  speculative?: SpeculativeRequest;
  signal?: AbortSignal;
  model?: string;
  /** Choices to generate for the prompt (1..16, default 1): they share its KV blocks, choice `i`
   * samples with `seed` + `i`, and a stream interleaves their chunks (by `index`). */
  n?: number;
  /** Structured output (one of the four fields): the answer is constrained token by token to
   * a JSON Schema, a regex, a grammar or a list of choices, on WebGPU and the CPU engine. A
   * schema or grammar the engine cannot enforce is refused ('bad-argument' naming the field). */
  response_format?: ResponseFormat;
  /** vLLM's form: exactly one of its fields. */
  structured_outputs?: StructuredOutputs;
  /** llama-server's form: a JSON Schema. */
  json_schema?: JsonSchema;
  /** llama-server's form: a GBNF grammar (rules `name ::= ...`, `root` first) or a Lark one. */
  grammar?: string;
}

/** A JSON Schema (draft 2020-12; docs/REQUESTS.md lists the keywords enforced). */
export type JsonSchema = Record<string, unknown> | boolean;

/** OpenAI's response formats, and WebLLM's: `json_object` with a `schema` (an object or its JSON
 * text), and `grammar` (GBNF or Lark). */
export type ResponseFormat =
  | { type: 'text' }
  | { type: 'json_object'; schema?: JsonSchema | string }
  | {
      type: 'json_schema';
      /** `strict: false` ignores keywords the engine cannot enforce instead of refusing them. */
      json_schema: { name: string; schema?: JsonSchema; strict?: boolean | null; description?: string };
    }
  | { type: 'grammar'; grammar: string };

export interface StructuredOutputs {
  json?: JsonSchema | string;
  json_object?: boolean;
  /** The whole answer matches it. */
  regex?: string;
  /** The answer is one of these strings. */
  choice?: string[];
  /** Lark (llguidance's dialect) or GBNF. */
  grammar?: string;
}

export interface SpeculativeRequest {
  /** 'lookup': drafts copied from the prompt and output; 'draft-model': from `createEngine({ draftModel })`. */
  mode: 'lookup' | 'draft-model';
  /** Most draft tokens per step, 1..64 (default 15 for 'lookup', 5 for 'draft-model'). Each step drafts and verifies the number in
   * 0..draftTokens that gives the most tokens per second at the acceptance rate and the pass costs
   * measured so far (0: a plain step, where speculation would be slower). */
  draftTokens?: number;
  /** Draft and verify up to `draftTokens` every step instead (default false). With sampling this
   * makes a seeded request reproducible: adaptive lengths depend on measured timings. */
  fixedLength?: boolean;
  /** 'draft-model': stop drafting where the draft model's top token is less likely than this,
   * 0..1 (default 0.6; 0 always drafts `draftTokens`), as `hearth run --draft-min-p`. */
  draftMinP?: number;
  /** 'draft-model' only: prompt lookup first (free drafts where the output copies the prompt,
   * e.g. the unchanged lines of an edited function), the draft model where nothing matches, as
   * `hearth run --lookup --draft-model` (default false). */
  lookup?: boolean;
}

/** What speculation did during one request. */
export interface SpeculativeUsage {
  proposed: number;
  accepted: number;
  target_forward_passes: number;
  acceptance_rate: number;
  mean_accepted_per_step: number;
  /** Of the above, the prompt lookup's share with `lookup: true` (0 otherwise). */
  free_proposed: number;
  free_accepted: number;
  free_passes: number;
  /** ms the draft model took to read the prompt, after the first token (part of the decode time). */
  drafter_prepare_ms: number;
}

export interface ChatMessage {
  role: 'system' | 'user' | 'assistant' | 'tool' | string;
  content: string | Array<{ type: 'text'; text: string }> | null;
  /** An assistant turn's calls, as an answer returned them (sent back with the tools' results). */
  tool_calls?: ToolCall[];
  /** A 'tool' turn: the call it answers. */
  tool_call_id?: string;
}

/** A function the model may call (OpenAI's shape). */
export interface Tool {
  type: 'function';
  function: {
    name: string;
    description?: string;
    /** A JSON Schema of the arguments object: every call's arguments are valid under it. */
    parameters?: JsonSchema;
    /** Refuse the request when the schema has a keyword the engine cannot enforce (otherwise
     * such keywords are ignored). */
    strict?: boolean;
  };
}

export interface ToolCall {
  id: string;
  type: 'function';
  /** `arguments`: the arguments object as JSON text. */
  function: { name: string; arguments: string };
}

/** A piece of a streamed call: its id, type and name first, then its arguments in pieces. */
export interface ToolCallDelta {
  index: number;
  id?: string;
  type?: 'function';
  function: { name?: string; arguments: string };
}

export interface ChatCompletionRequest extends SamplingRequest {
  messages: ChatMessage[];
  stream?: boolean;
  /** The answer's log-probabilities (not with `speculative`), with `top_logprobs` (0..20)
   * alternatives per token. */
  logprobs?: boolean;
  top_logprobs?: number;
  /** Functions the model may call, rendered by its chat template (models whose template writes
   * Hermes / Qwen `<tool_call>` calls, or Llama 3.x JSON calls); each call's arguments are constrained to its schema. */
  tools?: Tool[];
  /** 'auto' (default: text or calls, constrained once the model opens a call), 'none', 'required'
   * (only calls), or a named function (one call of it). */
  tool_choice?: 'none' | 'auto' | 'required' | { type: 'function'; function: { name: string } };
  /** Several calls in one answer (default true). */
  parallel_tool_calls?: boolean;
}

export interface CompletionRequest extends SamplingRequest {
  prompt: string;
  stream?: boolean;
  /** The answer's log-probabilities with this many alternatives per token (0..20). */
  logprobs?: number;
  /** The text (streamed: each choice's first chunk) starts with the prompt, and with `logprobs`
   * the log-probabilities start with the prompt tokens' (the first null). */
  echo?: boolean;
}

export type FinishReason = 'stop' | 'length' | 'abort' | 'tool_calls';

export interface Usage {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
  ttft_ms: number;
  prefill_tok_s: number;
  decode_tok_s: number;
  /** Requests with `speculative`: draft tokens proposed and accepted. */
  speculative?: SpeculativeUsage;
  /** Constrained requests: token masks computed and their times (with `n` > 1, the slowest
   * choice's times), and the tokens the grammar forced (verified with the token before them:
   * no step of their own). */
  grammar?: {
    masks: number;
    forced_tokens: number;
    mask_mean_us: number;
    mask_p50_us: number;
    mask_p99_us: number;
    compile_us: number;
    /** Rows whose allowed tokens were not among the candidates read back: evaluated again whole. */
    full_logits_rows: number;
  };
}

/** Non-standard details on the last chunk / the response. */
export interface HearthDetails {
  prompt_token_ids: number[];
  token_ids: number[];
  /** Prompt tokens reused from the KV cache. */
  prompt_cached: number;
  seed: number;
  /** With `n` > 1: each choice's token ids and seed (the fields above are the first choice's). */
  choices?: Array<{ token_ids: number[]; seed: number }>;
}

/** One token of chat's `logprobs.content`: the model's log-probability (before temperature and
 * the filters) and the most likely alternatives at its position. */
export interface ChatTokenLogprob {
  token: string;
  logprob: number;
  bytes: number[];
  top_logprobs: Array<{ token: string; logprob: number; bytes: number[] }>;
}

export interface ChatLogprobs {
  content: ChatTokenLogprob[];
  refusal: null;
}

/** The legacy completions' `logprobs`. */
export interface CompletionLogprobs {
  tokens: string[];
  token_logprobs: number[];
  top_logprobs: Array<Record<string, number>>;
  text_offset: number[];
}

export interface ChatCompletionChunk {
  id: string;
  object: 'chat.completion.chunk';
  created: number;
  model: string;
  /** `logprobs`: on the last chunk, the whole answer's when the request asked for them. */
  choices: Array<{ index: number; delta: { role?: 'assistant'; content?: string; tool_calls?: ToolCallDelta[] }; finish_reason: FinishReason | null; logprobs: ChatLogprobs | null }>;
  usage?: Usage;
  hearth?: HearthDetails;
}

export interface ChatCompletion {
  id: string;
  object: 'chat.completion';
  created: number;
  model: string;
  choices: Array<{ index: number; message: { role: 'assistant'; content: string | null; tool_calls?: ToolCall[] }; finish_reason: FinishReason; logprobs: ChatLogprobs | null }>;
  usage: Usage;
  hearth: HearthDetails;
}

export interface Completion {
  id: string;
  object: 'text_completion';
  created: number;
  model: string;
  choices: Array<{ index: number; text: string; finish_reason: FinishReason | null; logprobs: CompletionLogprobs | null }>;
  usage?: Usage;
  hearth?: HearthDetails;
}

export interface AdapterInfo {
  name: string;
  /** wgpu's name for the API underneath ('BrowserWebGpu'). */
  backend: string;
  device_type: string;
  /** The adapter offers `shader-f16` and it was requested. */
  shader_f16: boolean;
  subgroups: boolean;
  /** The 8-bit mat-mul uses WGSL's `dot4I8Packed` (the browser lists `packed_4x8_integer_dot_product`). */
  packed_dot: boolean;
  /** The kernels are shaped for a GPU (on GPUs; not on software adapters): the q/k/v and the gate/up
   * mat-muls share one dispatch each, attention issues its loads several at a time. */
  gpu_shapes: boolean;
  /** The kernel variant in use: 'f16+subgroups', 'f16', 'subgroups' or 'f32'. */
  variant: 'f16+subgroups' | 'f16' | 'subgroups' | 'f32';
  max_storage_buffer_binding_size: number;
  max_buffer_size: number;
}

export interface RuntimeStats {
  backend: 'webgpu' | 'cpu-wasm';
  /** WebGPU: the adapter in use and the limits requested from it. */
  adapter: AdapterInfo | null;
  /** backend 'auto' running on the CPU: why WebGPU was not used. */
  fallback_reason: string | null;
  simd128: boolean;
  threads: number;
  worker: boolean;
  wasm_memory_bytes: number;
  backend_memory_bytes: number | null;
  model: { architecture: string; n_ctx: number; n_ctx_train: number; n_vocab: number; n_layer: number; has_chat_template: boolean; file_bytes: number } | null;
  /** Continuous batching of concurrent requests (figures as of the last forward pass). */
  batch: BatchStats | null;
  /** A draft model is loaded. */
  draft_model: boolean;
  /** Where the draft model runs (null without one). */
  draft: DraftStats | null;
}

export interface DraftStats {
  backend: 'webgpu' | 'cpu-wasm';
  /** WebGPU: the draft's own device. */
  adapter: AdapterInfo | null;
  /** draftBackend 'auto' running on the CPU: why WebGPU was not used. */
  fallback_reason: string | null;
  /** null while a request runs. */
  backend_memory_bytes: number | null;
}

export interface BatchStats {
  max_batch: number;
  running: number;
  waiting: number;
  /** Most requests evaluated in one forward pass since loading. */
  max_batch_observed: number;
  /** Forward passes run. */
  steps: number;
  kv_blocks_used: number;
  kv_blocks_total: number;
  preemptions: number;
}

export interface Engine {
  /** The model bytes came from the model cache. */
  readonly fromCache: boolean;
  /** Non-fatal problems while loading (e.g. 'quota-exceeded': the model was not cached). */
  readonly warnings: HearthError[];
  chat: {
    completions: {
      create(request: ChatCompletionRequest & { stream: true }): Promise<AsyncIterable<ChatCompletionChunk>>;
      create(request: ChatCompletionRequest & { stream?: false }): Promise<ChatCompletion>;
    };
  };
  completions: {
    create(request: CompletionRequest & { stream: true }): Promise<AsyncIterable<Completion>>;
    create(request: CompletionRequest & { stream?: false }): Promise<Completion>;
  };
  /** Stops every running generation; their results end with finish_reason 'abort'. */
  interrupt(): void;
  unload(): Promise<void>;
  runtimeStats(): Promise<RuntimeStats>;
}

/** Rejects with a HearthError. */
export function createEngine(options: CreateEngineOptions): Promise<Engine>;

