// Conversations in localStorage (this browser only): { chats: [{ id, title, updated, messages }], currentId }.
// messages: [{ role: 'user' | 'assistant', content, stats? }].

const KEY = 'hearth-chat.v1';

export function loadState(storage = globalThis.localStorage) {
  try {
    const state = JSON.parse(storage?.getItem(KEY) ?? 'null');
    if (state && Array.isArray(state.chats)) {
      state.chats = state.chats.filter((c) => c && typeof c.id === 'string' && Array.isArray(c.messages));
      return state;
    }
  } catch {
    // A corrupt entry (edited by hand, another version): start over rather than fail to open.
  }
  return { chats: [], currentId: null };
}

export function saveState(state, storage = globalThis.localStorage) {
  try {
    storage?.setItem(KEY, JSON.stringify(state));
  } catch (error) {
    console.warn(`hearth chat: could not save the history (${error.message})`);
  }
}

export function newChat() {
  return { id: `chat-${Date.now().toString(36)}-${Math.random().toString(36).slice(2, 8)}`, title: 'New chat', updated: Date.now(), messages: [] };
}

/** The first user message, shortened, names the chat. */
export function titleFor(chat) {
  const first = chat.messages.find((m) => m.role === 'user')?.content.trim().replace(/\s+/g, ' ') ?? '';
  return first ? (first.length > 40 ? `${first.slice(0, 40)}…` : first) : 'New chat';
}
