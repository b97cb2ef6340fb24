// Compiled (never run) by tests/browser/types.test.js with `tsc --noEmit`: the public API as a user
// writes it must type-check against web/hearth-llm/dist/index.d.ts.
import { createEngine, deleteCachedModel, listCachedModels, HearthError, type HearthErrorCode, type Progress, type CachedModel, type Tool, type ToolCall, type ChatMessage, type FinishReason } from '../../web/hearth-llm/dist/index.js';

async function usage(): Promise<void> {
  const controller = new AbortController();
  const engine = await createEngine({
    model: '/models/gemma-3-270m-q4_k_m.gguf',
    cache: 'revalidate',
    backend: 'cpu',
    signal: controller.signal,
    maxBatch: 4,
    draftModel: '/models/gemma-3-270m-q4_k_m.gguf',
    onProgress: (p: Progress) => {
      const phase: 'download' | 'cache' | 'read' | 'load' | 'ready' = p.phase;
      if (p.warning) console.warn(p.warning.code, phase, p.fromCache, p.cached);
    },
  });
  const fromCache: boolean = engine.fromCache;
  const warningCodes: HearthErrorCode[] = engine.warnings.map((w) => w.code);
  const cached: CachedModel[] = await listCachedModels();
  const removed: boolean = await deleteCachedModel(cached[0].url);
  try {
    await engine.completions.create({ prompt: 'x', temperature: 0 });
    await engine.completions.create({ prompt: 'x', repeat_last_n: 64, logit_bias: { '5': -100 }, prediction: { type: 'content', content: 'x = 1' }, user: 'u' });
  } catch (error) {
    if (error instanceof HearthError && error.code === 'bad-argument') console.log(error.param, error.message);
  }
  const [a, b] = await Promise.all([
    engine.completions.create({ prompt: 'x', temperature: 0, speculative: { mode: 'lookup', draftTokens: 4 } }),
    engine.completions.create({ prompt: 'y', speculative: { mode: 'draft-model' } }),
  ]);
  const accepted: number | undefined = a.usage?.speculative?.accepted;
  const stats = await engine.runtimeStats();
  const batched: number | undefined = stats.batch?.max_batch_observed;
  console.log(accepted, batched, stats.draft_model, b.choices[0].text);
  // Structured output and tools.
  const schema = { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] };
  const json = await engine.chat.completions.create({
    messages: [{ role: 'user', content: 'x' }],
    response_format: { type: 'json_schema', json_schema: { name: 'city', schema, strict: true } },
  });
  const masks: number | undefined = json.usage?.grammar?.masks;
  await engine.chat.completions.create({ messages: [{ role: 'user', content: 'x' }], response_format: { type: 'json_object', schema: JSON.stringify(schema) } });
  await engine.chat.completions.create({ messages: [{ role: 'user', content: 'x' }], structured_outputs: { choice: ['yes', 'no'] } });
  await engine.chat.completions.create({ messages: [{ role: 'user', content: 'x' }], grammar: 'root ::= "a"' });
  const tools: Tool[] = [{ type: 'function', function: { name: 'get_weather', parameters: schema } }];
  const called = await engine.chat.completions.create({ messages: [{ role: 'user', content: 'x' }], tools, tool_choice: 'required' });
  const calls: ToolCall[] | undefined = called.choices[0].message.tool_calls;
  const finish: FinishReason = called.choices[0].finish_reason;
  const followUp: ChatMessage[] = [
    { role: 'assistant', content: null, tool_calls: calls },
    { role: 'tool', tool_call_id: calls?.[0].id, content: '{"temperature": 18}' },
  ];
  for await (const chunk of await engine.chat.completions.create({ messages: followUp, tools, tool_choice: { type: 'function', function: { name: 'get_weather' } }, stream: true })) {
    const piece: string | undefined = chunk.choices[0].delta.tool_calls?.[0].function.arguments;
    console.log(piece);
  }
  console.log(masks, finish);
  const made = new HearthError('no-webgpu', 'x');
  console.log(fromCache, warningCodes, removed, made.name);
}

void usage;
