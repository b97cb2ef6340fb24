// Types of hearth-llm/webllm: WebLLM's API (@mlc-ai/web-llm) over hearth-llm's engine. The
// request and answer shapes are hearth-llm's (index.d.ts), which take WebLLM's.

import type {
  ChatCompletion as HearthChatCompletion,
  ChatCompletionChunk as HearthChatCompletionChunk,
  ChatCompletionRequest as HearthChatCompletionRequest,
  ChatMessage,
  Completion as HearthCompletion,
  CompletionRequest as HearthCompletionRequest,
  CreateEngineOptions,
  HearthError,
  RuntimeStats,
  Tool,
  Usage,
} from './index.js';

export { HearthError };
export type { ResponseFormat, ToolCall, ToolCallDelta, FinishReason } from './index.js';

export interface InitProgressReport {
  /** 0..1: reading the file is the first 80%, loading it into the engine the rest. */
  progress: number;
  /** Seconds since the load began. */
  timeElapsed: number;
  text: string;
}
export type InitProgressCallback = (report: InitProgressReport) => void;
export type LogLevel = 'TRACE' | 'DEBUG' | 'INFO' | 'WARN' | 'ERROR' | 'SILENT';

/** A model: `model` is the URL of its GGUF file. */
export interface ModelRecord {
  model: string;
  model_id: string;
  /** WebLLM's compiled library: GGUF models have none (ignored). */
  model_lib?: string;
  overrides?: ChatOptions;
  vram_required_MB?: number;
  low_resource_required?: boolean;
  required_features?: string[];
}

export interface AppConfig {
  model_list: ModelRecord[];
  /** Models are kept in OPFS (else Cache Storage) whatever this says. */
  cacheBackend?: 'cache' | 'indexeddb' | 'cross-origin';
}

/** WebLLM's chat options hearth-llm applies (others are refused: the model's configuration, chat
 * template and tokenizer come from its GGUF file). */
export interface ChatOptions {
  context_window_size?: number;
  /** -1 only (off). */
  sliding_window_size?: number;
  /** -1 only (off). */
  attention_sink_size?: number;
  temperature?: number;
  top_p?: number;
  repetition_penalty?: number;
  frequency_penalty?: number;
  presence_penalty?: number;
}

export interface MLCEngineConfig {
  appConfig?: AppConfig;
  initProgressCallback?: InitProgressCallback;
  logLevel?: LogLevel;
  /** Refused when not empty (custom logit processors). */
  logitProcessorRegistry?: Map<string, unknown>;
  /** hearth-llm's createEngine options (MLCEngine only: a worker engine always runs in its worker). */
  hearth?: Pick<CreateEngineOptions, 'backend' | 'worker' | 'cache' | 'maxBatch'>;
}

export type ChatCompletionMessageParam = ChatMessage;
export type ChatCompletionTool = Tool;
export type ChatCompletionRole = ChatMessage['role'];

/** WebLLM's `extra_body`: refused when set (no latency breakdown, no chat template arguments). */
export interface ExtraBody {
  enable_thinking?: never;
  enable_latency_breakdown?: false;
}

interface WebLLMRequestFields {
  stream_options?: { include_usage?: boolean };
  extra_body?: ExtraBody;
}

export type ChatCompletionRequestBase = HearthChatCompletionRequest & WebLLMRequestFields;
export type ChatCompletionRequestNonStreaming = ChatCompletionRequestBase & { stream?: false | null };
export type ChatCompletionRequestStreaming = ChatCompletionRequestBase & { stream: true };
export type ChatCompletionRequest = ChatCompletionRequestNonStreaming | ChatCompletionRequestStreaming;

/** `logprobs`: OpenAI's count of alternatives, or WebLLM's `true` with `top_logprobs`. */
export type CompletionCreateParamsBase = Omit<HearthCompletionRequest, 'logprobs'> & WebLLMRequestFields & { logprobs?: number | boolean; top_logprobs?: number };
export type CompletionCreateParamsNonStreaming = CompletionCreateParamsBase & { stream?: false | null };
export type CompletionCreateParamsStreaming = CompletionCreateParamsBase & { stream: true };
export type CompletionCreateParams = CompletionCreateParamsNonStreaming | CompletionCreateParamsStreaming;

/** WebLLM's timings of a request. */
export interface UsageExtra {
  e2e_latency_s: number;
  prefill_tokens_per_s: number;
  decode_tokens_per_s: number;
  time_to_first_token_s: number;
  time_per_output_token_s: number;
  /** Structured output: the grammar's compile time. */
  grammar_init_s?: number;
  /** Structured output: the mean time of a token's mask. */
  grammar_per_token_s?: number;
}

/** hearth-llm's usage, with `prompt_tokens` counting the tokens prefilled (as WebLLM's). */
export interface CompletionUsage extends Usage {
  extra: UsageExtra;
}

export type ChatCompletion = Omit<HearthChatCompletion, 'usage'> & { usage: CompletionUsage };
export type ChatCompletionChunk = Omit<HearthChatCompletionChunk, 'usage'> & { usage?: CompletionUsage };
export type Completion = Omit<HearthCompletion, 'usage'> & { usage?: CompletionUsage };

export interface MLCEngineInterface {
  chat: {
    completions: {
      create(request: ChatCompletionRequestNonStreaming): Promise<ChatCompletion>;
      create(request: ChatCompletionRequestStreaming): Promise<AsyncIterable<ChatCompletionChunk>>;
      create(request: ChatCompletionRequestBase): Promise<AsyncIterable<ChatCompletionChunk> | ChatCompletion>;
    };
  };
  completions: {
    create(request: CompletionCreateParamsNonStreaming): Promise<Completion>;
    create(request: CompletionCreateParamsStreaming): Promise<AsyncIterable<Completion>>;
    create(request: CompletionCreateParamsBase): Promise<AsyncIterable<Completion> | Completion>;
  };
  embeddings: { create(request?: unknown): Promise<never> };
  chatCompletion(request: ChatCompletionRequestNonStreaming): Promise<ChatCompletion>;
  chatCompletion(request: ChatCompletionRequestStreaming): Promise<AsyncIterable<ChatCompletionChunk>>;
  chatCompletion(request: ChatCompletionRequestBase): Promise<AsyncIterable<ChatCompletionChunk> | ChatCompletion>;
  completion(request: CompletionCreateParamsNonStreaming): Promise<Completion>;
  completion(request: CompletionCreateParamsStreaming): Promise<AsyncIterable<Completion>>;
  completion(request: CompletionCreateParamsBase): Promise<AsyncIterable<Completion> | Completion>;
  setInitProgressCallback(callback: InitProgressCallback | undefined): void;
  getInitProgressCallback(): InitProgressCallback | undefined;
  setAppConfig(appConfig: AppConfig): void | Promise<void>;
  setLogLevel(logLevel: LogLevel): void | Promise<void>;
  /** Loads the model(s), unloading what was loaded; returns without loading when unload() is
   * called meanwhile. */
  reload(modelId: string | string[], chatOpts?: ChatOptions | ChatOptions[]): Promise<void>;
  unload(): Promise<void>;
  /** Stops the running generations (finish_reason 'abort'). */
  interruptGenerate(): void;
  resetChat(keepStats?: boolean, modelId?: string): Promise<void>;
  getMessage(modelId?: string): Promise<string>;
  runtimeStatsText(modelId?: string): Promise<string>;
  /** hearth-llm's statistics of a loaded model. */
  runtimeStats(modelId?: string): Promise<RuntimeStats>;
  getMaxStorageBufferBindingSize(): Promise<number>;
  getGPUVendor(): Promise<string>;
  /** Refused (hearth-llm runs text-generation models). */
  embedding(request?: unknown): Promise<never>;
  /** Refused. */
  forwardTokensAndSample(inputIds: number[], isPrefill: boolean, modelId?: string): Promise<never>;
}

/** Has every method of MLCEngineInterface (declaration merging). */
export interface MLCEngine extends MLCEngineInterface {}
export class MLCEngine {
  constructor(engineConfig?: MLCEngineConfig);
}

export class WebWorkerMLCEngine extends MLCEngine {
  constructor(worker: Worker | { onmessage: unknown; postMessage(message: unknown): void }, engineConfig?: Omit<MLCEngineConfig, 'hearth'>);
}

/** Runs an MLCEngine in the app's worker: `self.onmessage = (msg) => handler.onmessage(msg)`. */
export class WebWorkerMLCEngineHandler {
  constructor();
  engine: MLCEngine;
  onmessage(event: MessageEvent, onComplete?: (value: unknown) => void, onError?: (error: unknown) => void): Promise<void>;
  postMessage(message: unknown): void;
  setLogitProcessorRegistry(registry?: Map<string, unknown>): void;
}

/** `modelId`: an id of `appConfig.model_list` (default `prebuiltAppConfig`), a GGUF URL, or an
 * MLC id of a model prebuiltAppConfig has as a GGUF. Rejects with ModelNotFoundError otherwise. */
export function CreateMLCEngine(modelId: string | string[], engineConfig?: MLCEngineConfig, chatOpts?: ChatOptions | ChatOptions[]): Promise<MLCEngine>;
export function CreateWebWorkerMLCEngine(worker: Worker, modelId: string | string[], engineConfig?: Omit<MLCEngineConfig, 'hearth'>, chatOpts?: ChatOptions | ChatOptions[]): Promise<WebWorkerMLCEngine>;
/** Refused: use CreateWebWorkerMLCEngine (the model file stays cached in OPFS). */
export function CreateServiceWorkerMLCEngine(...args: unknown[]): never;
export function ServiceWorkerMLCEngineHandler(...args: unknown[]): never;
export function CreateExtensionServiceWorkerMLCEngine(...args: unknown[]): never;
export function ExtensionServiceWorkerMLCEngineHandler(...args: unknown[]): never;

export class ModelNotFoundError extends HearthError {}
export class ModelNotLoadedError extends HearthError {}

export const prebuiltAppConfig: AppConfig;
export const modelVersion: string;
export const modelLibURLPrefix: string;

export function hasModelInCache(modelId: string, appConfig?: AppConfig): Promise<boolean>;
export function deleteModelAllInfoInCache(modelId: string, appConfig?: AppConfig): Promise<void>;
export function deleteModelInCache(modelId: string, appConfig?: AppConfig): Promise<void>;
export function deleteChatConfigInCache(modelId: string, appConfig?: AppConfig): Promise<void>;
export function deleteModelWasmInCache(modelId: string, appConfig?: AppConfig): Promise<void>;
