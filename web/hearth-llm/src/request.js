// A request's JS-only parts stay here: the abort signal and whether to stream. Everything else goes
// to the engine as the JS object it is, where the core's one request schema checks it
// (crates/hearth-core/src/request), as `hearth serve` does: the browser accepts and refuses exactly
// what the server does. A refusal is a HearthError 'bad-argument' naming the field in `param`.

import { HearthError } from './errors.js';

function fail(message, param) {
  const error = new HearthError('bad-argument', `hearth-llm: ${message}`);
  if (param) error.param = param;
  throw error;
}

/** Splits a request for the engine; returns { request, stream, signal }. `kind`: 'chat' | 'text'. */
export function checkRequest(request, kind) {
  const where = kind === 'chat' ? 'chat.completions.create' : 'completions.create';
  if (request === null || typeof request !== 'object' || Array.isArray(request)) fail(`${where} expects a request object`);
  const { signal, ...body } = request;
  if (signal !== undefined && !(typeof AbortSignal !== 'undefined' && signal instanceof AbortSignal)) fail(`${where}: \`signal\` must be an AbortSignal`, 'signal');
  return { request: body, stream: Boolean(request.stream), signal };
}
