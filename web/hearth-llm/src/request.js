// Checks OpenAI-shaped requests and maps them to the engine's option names. Bad arguments throw
// HearthError 'bad-argument' naming the field (with `kind` TypeError/RangeError), before anything
// reaches the engine.

import { HearthError } from './errors.js';

// Accepted for compatibility and ignored (one local model, one choice, no tools yet).
const IGNORED = new Set(['model', 'stream_options', 'user', 'n', 'logprobs', 'top_logprobs', 'response_format']);
const SAMPLING = ['temperature', 'top_p', 'top_k', 'min_p', 'max_tokens', 'seed', 'stop', 'presence_penalty', 'frequency_penalty', 'repetition_penalty', 'ignore_eos', 'speculative'];
const SPECULATIVE_MODES = ['lookup', 'draft-model'];

function fail(Kind, message) {
  const error = new HearthError('bad-argument', `hearth-llm: ${message}`);
  error.kind = Kind.name; // 'TypeError' (wrong type) or 'RangeError' (out of range)
  throw error;
}

function number(request, name, { min = -Infinity, max = Infinity, integer = false } = {}) {
  const value = request[name];
  if (value === undefined || value === null) return undefined;
  if (typeof value !== 'number' || Number.isNaN(value)) fail(TypeError, `\`${name}\` must be a number, got ${typeof value}`);
  if (integer && !Number.isInteger(value)) fail(TypeError, `\`${name}\` must be an integer, got ${value}`);
  if (value < min || value > max) fail(RangeError, `\`${name}\` must be in [${min}, ${max}], got ${value}`);
  return value;
}

/** OpenAI request → the engine's sampling options (snake_case, as crates/hearth-wasm parses them). */
export function samplingOptions(request) {
  const options = {
    temperature: number(request, 'temperature', { min: 0, max: 100 }),
    top_p: number(request, 'top_p', { min: 0, max: 1 }),
    top_k: number(request, 'top_k', { min: 0, integer: true }),
    min_p: number(request, 'min_p', { min: 0, max: 1 }),
    max_tokens: number(request, 'max_tokens', { min: 1, integer: true }),
    seed: number(request, 'seed', { min: 0, max: Number.MAX_SAFE_INTEGER, integer: true }),
    presence_penalty: number(request, 'presence_penalty', { min: -2, max: 2 }),
    frequency_penalty: number(request, 'frequency_penalty', { min: -2, max: 2 }),
    repeat_penalty: number(request, 'repetition_penalty', { min: 0.01, max: 100 }),
  };
  if (request.max_completion_tokens !== undefined) options.max_tokens = number(request, 'max_completion_tokens', { min: 1, integer: true });
  const stop = request.stop;
  if (stop !== undefined && stop !== null) {
    const list = typeof stop === 'string' ? [stop] : stop;
    if (!Array.isArray(list) || list.some((s) => typeof s !== 'string' || s === '')) fail(TypeError, '`stop` must be a non-empty string or an array of them');
    options.stop = list;
  }
  if (request.ignore_eos !== undefined) options.ignore_eos = Boolean(request.ignore_eos);
  if (request.speculative !== undefined && request.speculative !== null) options.speculative = speculativeOptions(request.speculative);
  for (const key of Object.keys(options)) if (options[key] === undefined) delete options[key];
  return options;
}

/** `speculative: { mode: 'lookup' | 'draft-model', draftTokens?, draftMinP?, fixedLength?, lookup? }`
 * (as `hearth run --lookup` / `--draft-model` / `--draft-tokens K` / `--draft-min-p P` /
 * `--fixed-draft-length` / `--lookup --draft-model`) → the engine's `{ mode, draft_tokens,
 * draft_min_p, fixed_length, lookup }`. */
function speculativeOptions(speculative) {
  if (typeof speculative !== 'object' || Array.isArray(speculative)) fail(TypeError, '`speculative` must be an object like { mode: \'lookup\', draftTokens: 5 }');
  for (const key of Object.keys(speculative)) if (!['mode', 'draftTokens', 'draftMinP', 'fixedLength', 'lookup'].includes(key)) fail(TypeError, `speculative: unknown field \`${key}\``);
  if (!SPECULATIVE_MODES.includes(speculative.mode)) fail(TypeError, `speculative.mode must be 'lookup' or 'draft-model', got ${JSON.stringify(speculative.mode)}`);
  const draftTokens = number(speculative, 'draftTokens', { min: 1, max: 64, integer: true });
  const draftMinP = number(speculative, 'draftMinP', { min: 0, max: 1 });
  const fixedLength = speculative.fixedLength;
  if (fixedLength !== undefined && typeof fixedLength !== 'boolean') fail(TypeError, `speculative.fixedLength must be a boolean, got ${JSON.stringify(fixedLength)}`);
  const lookup = speculative.lookup;
  if (lookup !== undefined && typeof lookup !== 'boolean') fail(TypeError, `speculative.lookup must be a boolean, got ${JSON.stringify(lookup)}`);
  if (lookup && speculative.mode !== 'draft-model') fail(TypeError, "speculative.lookup goes with mode 'draft-model' (prompt lookup first, the draft model where nothing matches); mode 'lookup' is lookup alone");
  if (draftMinP !== undefined && speculative.mode !== 'draft-model') fail(TypeError, "speculative.draftMinP applies to mode 'draft-model' (where the draft model stops drafting); mode 'lookup' has no draft model");
  const options = { mode: speculative.mode };
  if (lookup !== undefined) options.lookup = lookup;
  if (draftTokens !== undefined) options.draft_tokens = draftTokens;
  if (draftMinP !== undefined) options.draft_min_p = draftMinP;
  if (fixedLength !== undefined) options.fixed_length = fixedLength;
  return options;
}

/** Validates a request; returns { prompt, options, stream, signal }. `kind`: 'chat' | 'text'. */
export function checkRequest(request, kind) {
  const where = kind === 'chat' ? 'chat.completions.create' : 'completions.create';
  if (request === null || typeof request !== 'object' || Array.isArray(request)) fail(TypeError, `${where} expects a request object`);
  const allowed = new Set([...SAMPLING, ...IGNORED, 'stream', 'signal', 'max_completion_tokens', kind === 'chat' ? 'messages' : 'prompt']);
  for (const key of Object.keys(request)) if (!allowed.has(key)) fail(TypeError, `${where}: unknown field \`${key}\``);
  if (request.n !== undefined && request.n !== 1) fail(RangeError, `${where}: only n = 1 is supported`);
  let prompt;
  if (kind === 'chat') {
    const messages = request.messages;
    if (!Array.isArray(messages) || messages.length === 0) fail(TypeError, `${where}: \`messages\` must be a non-empty array`);
    messages.forEach((m, i) => {
      if (m === null || typeof m !== 'object') fail(TypeError, `${where}: messages[${i}] must be an object`);
      if (typeof m.role !== 'string') fail(TypeError, `${where}: messages[${i}].role must be a string`);
      if (typeof m.content !== 'string' && !Array.isArray(m.content)) fail(TypeError, `${where}: messages[${i}].content must be a string or an array of parts`);
    });
    prompt = messages.map((m) => ({ ...m, content: typeof m.content === 'string' ? m.content : m.content.map((p) => (typeof p === 'string' ? p : (p?.text ?? ''))).join('') }));
  } else {
    if (typeof request.prompt !== 'string' || request.prompt === '') fail(TypeError, `${where}: \`prompt\` must be a non-empty string`);
    prompt = request.prompt;
  }
  const signal = request.signal;
  if (signal !== undefined && !(typeof AbortSignal !== 'undefined' && signal instanceof AbortSignal)) fail(TypeError, `${where}: \`signal\` must be an AbortSignal`);
  return { prompt, options: samplingOptions(request), stream: Boolean(request.stream), signal };
}
