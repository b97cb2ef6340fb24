// The private chat app: loads a GGUF model (URL or local file) into hearth-llm in a worker, streams
// answers with live TTFT and tok/s, keeps conversations in localStorage. Nothing leaves the page
// except the model download from the URL you choose.

import { createEngine, listCachedModels, deleteCachedModel } from '../hearth-llm/dist/index.js';
import { renderMarkdown } from './markdown.js';
import { loadState, saveState, newChat, titleFor } from './store.js';

const $ = (id) => document.getElementById(id);
const ui = {
  urlForm: $('url-form'), modelUrl: $('model-url'), loadUrl: $('load-url'), modelFile: $('model-file'),
  progressRow: $('progress-row'), progress: $('progress'), progressText: $('progress-text'), modelStatus: $('model-status'),
  mode: $('mode'), maxTokens: $('max-tokens'), temperature: $('temperature'), systemPrompt: $('system-prompt'), speculative: $('speculative'),
  answerFormat: $('answer-format'), answerSchema: $('answer-schema'), schemaRow: $('schema-row'),
  chatList: $('chat-list'), newChat: $('new-chat'), messages: $('messages'), stats: $('stats'),
  sendForm: $('send-form'), prompt: $('prompt'), send: $('send'), stop: $('stop'), regenerate: $('regenerate'),
  dropOverlay: $('drop-overlay'), cachedModels: $('cached-models'), cacheSummary: $('cache-summary'),
};

let engine = null;
let loading = false;
let generation = null; // { controller } while an answer streams
const state = loadState();
if (!state.chats.some((c) => c.id === state.currentId)) {
  const chat = state.chats[0] ?? newChat();
  if (!state.chats.includes(chat)) state.chats.unshift(chat);
  state.currentId = chat.id;
}
const currentChat = () => state.chats.find((c) => c.id === state.currentId);

// ---- model loading -------------------------------------------------------------------------

const MiB = 1024 * 1024;
function showProgress({ phase, loaded, total }) {
  ui.progressRow.hidden = false;
  if (phase === 'load') {
    ui.progress.removeAttribute('value'); // indeterminate: the engine parses and uploads tensors
    ui.progressText.textContent = 'loading the model into the engine…';
    return;
  }
  if (phase === 'ready') {
    ui.progress.value = 1;
    ui.progressText.textContent = 'ready';
    return;
  }
  const verb = phase === 'read' ? 'reading' : phase === 'cache' ? 'reading from the cache' : 'downloading';
  if (total) {
    ui.progress.value = loaded / total;
    ui.progressText.textContent = `${verb} ${(loaded / MiB).toFixed(0)} / ${(total / MiB).toFixed(0)} MiB (${((100 * loaded) / total).toFixed(0)}%)`;
  } else {
    ui.progress.removeAttribute('value');
    ui.progressText.textContent = `${verb} ${(loaded / MiB).toFixed(0)} MiB`;
  }
}

async function loadModel(source, name) {
  if (loading) return;
  loading = true;
  updateButtons();
  setStatus(`Loading ${name}…`);
  ui.progress.value = 0;
  try {
    generation?.controller.abort();
    const previous = engine;
    engine = null;
    await previous?.unload().catch(() => {});
    engine = await createEngine({ model: source, worker: true, onProgress: showProgress });
    const stats = await engine.runtimeStats();
    const model = stats.model ?? {};
    const details = [model.architecture, model.n_params ? `${(model.n_params / 1e6).toFixed(0)}M params` : null, stats.backend, stats.simd128 ? 'SIMD' : null].filter(Boolean);
    if (engine.fromCache) details.push('from the cache');
    const warning = engine.warnings[0] ? ` Not cached: ${engine.warnings[0].message}` : '';
    setStatus(`Loaded ${name}${details.length ? ` (${details.join(', ')})` : ''}.${warning}`);
    document.body.dataset.model = 'ready';
  } catch (error) {
    engine = null;
    ui.progressRow.hidden = true;
    setStatus(`Could not load ${name}: ${error.message}`, true);
  } finally {
    loading = false;
    updateButtons();
    renderCachedModels();
  }
}

// ---- model cache ---------------------------------------------------------------------------

async function renderCachedModels() {
  let models = [];
  try {
    models = await listCachedModels();
  } catch (error) {
    ui.cacheSummary.textContent = `(unavailable: ${error.message})`;
    return;
  }
  const total = models.reduce((sum, m) => sum + m.size, 0);
  ui.cacheSummary.textContent = models.length ? `(${models.length}, ${(total / MiB).toFixed(0)} MiB)` : '(none)';
  ui.cachedModels.replaceChildren(...models.map((model) => {
    const item = document.createElement('li');
    const name = document.createElement('span');
    name.className = 'name';
    name.textContent = `${decodeURIComponent(model.url.split('/').pop() || model.url)} · ${(model.size / MiB).toFixed(0)} MiB`;
    name.title = model.url;
    const load = document.createElement('button');
    load.type = 'button';
    load.className = 'load';
    load.textContent = 'Load';
    load.addEventListener('click', () => {
      ui.modelUrl.value = model.url;
      loadModel(model.url, model.url.split('/').pop() || model.url);
    });
    const remove = document.createElement('button');
    remove.type = 'button';
    remove.className = 'delete';
    remove.textContent = 'Delete';
    remove.title = 'Delete the cached copy (the next load downloads it again)';
    remove.addEventListener('click', async () => {
      await deleteCachedModel(model.url);
      renderCachedModels();
    });
    item.append(name, load, remove);
    return item;
  }));
}

function setStatus(text, isError = false) {
  ui.modelStatus.textContent = text;
  ui.modelStatus.classList.toggle('error', isError);
  ui.modelStatus.classList.remove('muted');
}

ui.urlForm.addEventListener('submit', (event) => {
  event.preventDefault();
  const url = ui.modelUrl.value.trim();
  if (url) loadModel(url, url.split('/').pop() || url);
});
ui.modelFile.addEventListener('change', () => {
  const file = ui.modelFile.files?.[0];
  if (file) loadModel(file, file.name);
  ui.modelFile.value = '';
});
let dragDepth = 0;
addEventListener('dragenter', (event) => {
  if (!event.dataTransfer?.types.includes('Files')) return;
  dragDepth++;
  ui.dropOverlay.hidden = false;
});
addEventListener('dragleave', () => {
  if (--dragDepth <= 0) (dragDepth = 0), (ui.dropOverlay.hidden = true);
});
addEventListener('dragover', (event) => event.preventDefault());
addEventListener('drop', (event) => {
  event.preventDefault();
  dragDepth = 0;
  ui.dropOverlay.hidden = true;
  const file = event.dataTransfer?.files?.[0];
  if (file) loadModel(file, file.name);
});

// ---- conversation --------------------------------------------------------------------------

function persist() {
  const chat = currentChat();
  chat.title = titleFor(chat);
  chat.updated = Date.now();
  saveState(state);
}

function renderChatList() {
  const items = [...state.chats].sort((a, b) => b.updated - a.updated).map((chat) => {
    const item = document.createElement('div');
    item.className = `chat-item${chat.id === state.currentId ? ' current' : ''}`;
    const open = document.createElement('button');
    open.type = 'button';
    open.className = 'open';
    open.textContent = chat.title;
    open.title = chat.title;
    open.addEventListener('click', () => switchChat(chat.id));
    const remove = document.createElement('button');
    remove.type = 'button';
    remove.className = 'delete';
    remove.textContent = '×';
    remove.title = 'Delete this chat';
    remove.addEventListener('click', () => deleteChat(chat.id));
    item.append(open, remove);
    return item;
  });
  ui.chatList.replaceChildren(...items);
}

function messageNode(message) {
  const node = document.createElement('article');
  node.className = `message ${message.role}${message.error ? ' error' : ''}`;
  const body = document.createElement('div');
  body.className = 'body';
  if (message.role === 'assistant') renderMarkdown(body, shown(message));
  else body.textContent = message.content;
  node.append(body);
  if (message.stats) {
    const meta = document.createElement('div');
    meta.className = 'meta';
    meta.textContent = formatStats(message.stats);
    node.append(meta);
  }
  return node;
}

function renderMessages() {
  ui.messages.replaceChildren(...currentChat().messages.map(messageNode));
  ui.messages.scrollTop = ui.messages.scrollHeight;
}

function formatStats({ ttft_ms, decode_tok_s, completion_tokens, finish_reason, live, speculative }) {
  const parts = [];
  if (ttft_ms !== undefined) parts.push(`TTFT ${ttft_ms.toFixed(0)} ms`);
  if (decode_tok_s) parts.push(`${decode_tok_s.toFixed(1)} tok/s`);
  if (completion_tokens !== undefined) parts.push(`${completion_tokens} tokens`);
  if (speculative) parts.push(`${speculative.accepted} of ${speculative.proposed} drafts kept`);
  if (finish_reason === 'abort') parts.push('stopped');
  if (finish_reason === 'length') parts.push('max tokens reached');
  if (live) parts.push('generating…');
  return parts.join(' · ');
}

function switchChat(id) {
  if (generation) return;
  state.currentId = id;
  saveState(state);
  renderAll();
}

function deleteChat(id) {
  if (generation && id === state.currentId) return;
  state.chats = state.chats.filter((c) => c.id !== id);
  if (!state.chats.length) state.chats.push(newChat());
  if (!state.chats.some((c) => c.id === state.currentId)) state.currentId = state.chats[0].id;
  saveState(state);
  renderAll();
}

function startNewChat() {
  if (generation) generation.controller.abort();
  const empty = state.chats.find((c) => c.messages.length === 0);
  const chat = empty ?? newChat();
  if (!empty) state.chats.unshift(chat);
  state.currentId = chat.id;
  saveState(state);
  renderAll();
  ui.prompt.focus();
}

function renderAll() {
  renderChatList();
  renderMessages();
  ui.stats.textContent = '';
  updateButtons();
}

function updateButtons() {
  const busy = Boolean(generation);
  const messages = currentChat().messages;
  ui.send.disabled = !engine || busy || loading;
  ui.stop.disabled = !busy;
  ui.regenerate.disabled = !engine || busy || loading || !messages.some((m) => m.role === 'user');
  ui.loadUrl.disabled = loading;
}

/** The answer format setting as a response_format: JSON, or JSON valid under the schema typed
 * in Settings (every token is constrained to it); null for free text. */
function responseFormat() {
  if (ui.answerFormat.value === 'json') return { type: 'json_object' };
  if (ui.answerFormat.value !== 'schema') return null;
  let schema;
  try {
    schema = JSON.parse(ui.answerSchema.value);
  } catch (error) {
    throw new Error(`the JSON Schema in Settings is not valid JSON (${error.message})`);
  }
  return { type: 'json_schema', json_schema: { name: 'answer', schema, strict: true } };
}

/** A message's text as rendered: JSON answers as a code block. */
function shown(message) {
  return message.format === 'json' && !message.error ? `\`\`\`json\n${message.content}\n\`\`\`` : message.content;
}

ui.answerFormat.addEventListener('change', () => {
  ui.schemaRow.hidden = ui.answerFormat.value !== 'schema';
});

/** The request for the conversation so far (ending with a user message). */
function buildRequest(messages, signal) {
  const maxTokens = Number(ui.maxTokens.value);
  const temperature = Number(ui.temperature.value);
  // No limit by default: the answer ends at the model's end of turn or the end of the context.
  // A limit past the context is refused (context-overflow), as a server refuses it.
  const sampling = {
    stream: true,
    signal,
    temperature: Number.isFinite(temperature) && temperature >= 0 ? temperature : 0.7,
  };
  if (ui.maxTokens.value !== '' && Number.isInteger(maxTokens) && maxTokens > 0) sampling.max_tokens = maxTokens;
  // Prompt lookup drafts tokens copied from the conversation (no second model); verification
  // keeps the model's output distribution (at temperature 0, its very text). It pays where an
  // answer repeats code from the chat.
  if (ui.speculative.value === 'lookup') sampling.speculative = { mode: 'lookup' };
  const format = responseFormat();
  if (format) sampling.response_format = format;
  if (ui.mode.value === 'completion') {
    // Template-less (base) models: continue the last user text.
    return { kind: 'completion', request: { ...sampling, prompt: messages.at(-1).content } };
  }
  const system = ui.systemPrompt.value.trim();
  const history = messages.filter((m) => !m.error).map(({ role, content }) => ({ role, content }));
  return { kind: 'chat', request: { ...sampling, messages: system ? [{ role: 'system', content: system }, ...history] : history } };
}

async function generate() {
  const chat = currentChat();
  const controller = new AbortController();
  generation = { controller };
  const answer = { role: 'assistant', content: '', ...(ui.answerFormat.value === 'text' ? {} : { format: 'json' }) };
  chat.messages.push(answer);
  persist();
  renderChatList();
  renderMessages();
  const node = ui.messages.lastElementChild;
  node.classList.add('streaming');
  const body = node.querySelector('.body');
  updateButtons();

  const started = performance.now();
  let firstAt = null;
  let pieces = 0;
  const live = () => {
    const now = performance.now();
    const stats = { live: true };
    if (firstAt !== null) {
      stats.ttft_ms = firstAt - started;
      if (pieces > 1 && now > firstAt) stats.decode_tok_s = ((pieces - 1) * 1000) / (now - firstAt);
      stats.completion_tokens = pieces;
    }
    ui.stats.textContent = formatStats(stats) || 'waiting for the first token…';
  };
  live();
  const timer = setInterval(live, 250);
  try {
    const { kind, request } = buildRequest(chat.messages.slice(0, -1), controller.signal);
    const stream = await (kind === 'chat' ? engine.chat.completions.create(request) : engine.completions.create(request));
    for await (const chunk of stream) {
      const choice = chunk.choices[0];
      const text = kind === 'chat' ? choice.delta?.content : choice.text;
      if (text) {
        if (firstAt === null) firstAt = performance.now();
        pieces++;
        answer.content += text;
        renderMarkdown(body, shown(answer));
        ui.messages.scrollTop = ui.messages.scrollHeight;
      }
      if (chunk.usage) answer.stats = { ...chunk.usage, finish_reason: choice.finish_reason };
    }
    if (!answer.stats) answer.stats = { ttft_ms: firstAt === null ? undefined : firstAt - started, completion_tokens: pieces, finish_reason: 'abort' };
  } catch (error) {
    if (controller.signal.aborted) {
      answer.stats = { completion_tokens: pieces, finish_reason: 'abort' };
    } else {
      answer.error = true;
      answer.content += `${answer.content ? '\n\n' : ''}Error: ${error.message}`;
      if (/no chat template/.test(error.message)) answer.content += '\n\nThis model has no chat template: choose "completion" mode in Settings.';
    }
  } finally {
    clearInterval(timer);
    generation = null;
    ui.stats.textContent = answer.stats ? formatStats(answer.stats) : '';
    document.body.dataset.lastAnswer = answer.error ? 'error' : 'done';
    persist();
    renderAll();
    ui.stats.textContent = answer.stats ? formatStats(answer.stats) : '';
  }
}

ui.sendForm.addEventListener('submit', (event) => {
  event.preventDefault();
  const text = ui.prompt.value.trim();
  if (!text || !engine || generation) return;
  ui.prompt.value = '';
  currentChat().messages.push({ role: 'user', content: text });
  generate();
});
ui.prompt.addEventListener('keydown', (event) => {
  if (event.key === 'Enter' && !event.shiftKey && !event.isComposing) {
    event.preventDefault();
    ui.sendForm.requestSubmit();
  }
});
ui.stop.addEventListener('click', () => {
  generation?.controller.abort();
  engine?.interrupt();
});
ui.regenerate.addEventListener('click', () => {
  if (!engine || generation) return;
  const messages = currentChat().messages;
  while (messages.length && messages.at(-1).role !== 'user') messages.pop();
  if (messages.length) generate();
});
ui.newChat.addEventListener('click', startNewChat);

renderAll();
renderCachedModels();
