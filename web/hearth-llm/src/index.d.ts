// hearth-llm: local LLM inference in the browser with an OpenAI/WebLLM-shaped API.

export type ModelSource = string | URL | Blob | File | Uint8Array | ArrayBuffer;

export interface Progress {
  /** download: fetching a URL · read: reading a File/Blob · load: weights into the engine · ready. */
  phase: 'download' | 'read' | 'load' | 'ready';
  loaded: number;
  /** 0 when unknown (no Content-Length). */
  total: number;
}

export interface CreateEngineOptions {
  model: ModelSource;
  onProgress?: (progress: Progress) => void;
  /** Run the engine in a dedicated Web Worker (default true). */
  worker?: boolean;
  /** Context size in tokens (default: min(training context, 4096)). */
  nCtx?: number;
}

export interface SamplingRequest {
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
  repetition_penalty?: number;
  ignore_eos?: boolean;
  signal?: AbortSignal;
  model?: string;
  n?: 1;
}

export interface ChatMessage {
  role: 'system' | 'user' | 'assistant' | string;
  content: string | Array<{ type: 'text'; text: string }>;
}

export interface ChatCompletionRequest extends SamplingRequest {
  messages: ChatMessage[];
  stream?: boolean;
}

export interface CompletionRequest extends SamplingRequest {
  prompt: string;
  stream?: boolean;
}

export type FinishReason = 'stop' | 'length' | 'abort';

export interface Usage {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
  ttft_ms: number;
  prefill_tok_s: number;
  decode_tok_s: number;
}

/** Non-standard details on the last chunk / the response. */
export interface HearthDetails {
  prompt_token_ids: number[];
  token_ids: number[];
  /** Prompt tokens reused from the KV cache. */
  prompt_cached: number;
  seed: number;
}

export interface ChatCompletionChunk {
  id: string;
  object: 'chat.completion.chunk';
  created: number;
  model: string;
  choices: Array<{ index: 0; delta: { role?: 'assistant'; content?: string }; finish_reason: FinishReason | null; logprobs: null }>;
  usage?: Usage;
  hearth?: HearthDetails;
}

export interface ChatCompletion {
  id: string;
  object: 'chat.completion';
  created: number;
  model: string;
  choices: Array<{ index: 0; message: { role: 'assistant'; content: string }; finish_reason: FinishReason; logprobs: null }>;
  usage: Usage;
  hearth: HearthDetails;
}

export interface Completion {
  id: string;
  object: 'text_completion';
  created: number;
  model: string;
  choices: Array<{ index: 0; text: string; finish_reason: FinishReason | null; logprobs: null }>;
  usage?: Usage;
  hearth?: HearthDetails;
}

export interface RuntimeStats {
  backend: 'cpu-wasm';
  simd128: boolean;
  threads: number;
  worker: boolean;
  wasm_memory_bytes: number;
  backend_memory_bytes: number | null;
  model: { architecture: string; n_ctx: number; n_ctx_train: number; n_vocab: number; n_layer: number; has_chat_template: boolean; file_bytes: number } | null;
}

export interface Engine {
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
  /** Stops the running generation; its result ends with finish_reason 'abort'. */
  interrupt(): void;
  unload(): Promise<void>;
  runtimeStats(): Promise<RuntimeStats>;
}

export function createEngine(options: CreateEngineOptions): Promise<Engine>;
