// A request's JS-only parts stay here: the abort signal and whether to stream. Everything else goes
// to the engine as JSON, where the core's one request schema checks it (crates/hearth-core/src/request),
// as `hearth serve` does: the browser accepts and refuses exactly what the server does. A refusal
// is a HearthError 'bad-argument' naming the field in `param`.

import { HearthError } from './errors.js';

function fail(message, param) {
  const error = new HearthError('bad-argument', `hearth-llm: ${message}`);
  if (param) error.param = param;
  throw error;
}

/** JSON has no NaN or Infinity (JSON.stringify writes null, which would read as "not given"):
 * refuse them here, naming the field. */
function checkFinite(value, path, param) {
  if (typeof value === 'number' && !Number.isFinite(value)) fail(`\`${path}\` must be a finite number, got ${value}`, param);
  if (value !== null && typeof value === 'object') {
    for (const [key, inner] of Object.entries(value)) checkFinite(inner, Array.isArray(value) ? `${path}[${key}]` : `${path}.${key}`, param);
  }
}

/** Splits a request for the engine; returns { request, stream, signal }. `kind`: 'chat' | 'text'. */
export function checkRequest(request, kind) {
  const where = kind === 'chat' ? 'chat.completions.create' : 'completions.create';
  if (request === null || typeof request !== 'object' || Array.isArray(request)) fail(`${where} expects a request object`);
  const { signal, ...body } = request;
  if (signal !== undefined && !(typeof AbortSignal !== 'undefined' && signal instanceof AbortSignal)) fail(`${where}: \`signal\` must be an AbortSignal`, 'signal');
  for (const [key, value] of Object.entries(body)) checkFinite(value, key, key);
  return { request: body, stream: Boolean(request.stream), signal };
}
