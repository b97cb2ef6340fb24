// Minimal markdown for chat answers: paragraphs (blank-line separated; single newlines kept as line
// breaks), `inline code`, and ``` fenced code blocks ``` (an unclosed fence while streaming is still
// a code block). Rendering builds DOM nodes and sets text through textContent only, so model output
// can never become markup.

/** Text → [{ type: 'code', lang, text } | { type: 'paragraph', spans: [{ code: bool, text }] }]. */
export function parseMarkdown(source) {
  const blocks = [];
  const lines = String(source).replace(/\r\n?/g, '\n').split('\n');
  let paragraph = [];
  const flushParagraph = () => {
    const text = paragraph.join('\n').trim();
    if (text) blocks.push({ type: 'paragraph', spans: inlineSpans(text) });
    paragraph = [];
  };
  for (let i = 0; i < lines.length; i++) {
    const fence = /^\s*(`{3,}|~{3,})\s*([\w+#.-]*)/.exec(lines[i]);
    if (fence) {
      flushParagraph();
      const marker = fence[1];
      const code = [];
      for (i++; i < lines.length && !lines[i].trim().startsWith(marker); i++) code.push(lines[i]);
      blocks.push({ type: 'code', lang: fence[2], text: code.join('\n') });
    } else if (lines[i].trim() === '') {
      flushParagraph();
    } else {
      paragraph.push(lines[i]);
    }
  }
  flushParagraph();
  return blocks;
}

/** `a `b` c` → spans; an unmatched backtick stays literal text. */
export function inlineSpans(text) {
  const spans = [];
  const pattern = /(`+)([^`]|[^`][\s\S]*?[^`])\1(?!`)/g;
  let last = 0;
  for (let match; (match = pattern.exec(text)); ) {
    if (match.index > last) spans.push({ code: false, text: text.slice(last, match.index) });
    spans.push({ code: true, text: match[2] });
    last = pattern.lastIndex;
  }
  if (last < text.length) spans.push({ code: false, text: text.slice(last) });
  return spans;
}

/** Replaces `container`'s children with the rendered markdown of `source`. */
export function renderMarkdown(container, source) {
  const doc = container.ownerDocument;
  const nodes = parseMarkdown(source).map((block) => (block.type === 'code' ? codeBlock(doc, block) : paragraphNode(doc, block)));
  container.replaceChildren(...nodes);
}

function paragraphNode(doc, block) {
  const p = doc.createElement('p');
  for (const span of block.spans) {
    if (span.code) {
      const code = doc.createElement('code');
      code.textContent = span.text;
      p.append(code);
    } else {
      // Single newlines inside a paragraph are line breaks.
      span.text.split('\n').forEach((line, i) => {
        if (i > 0) p.append(doc.createElement('br'));
        p.append(doc.createTextNode(line));
      });
    }
  }
  return p;
}

function codeBlock(doc, block) {
  const figure = doc.createElement('figure');
  figure.className = 'code-block';
  const bar = doc.createElement('figcaption');
  const lang = doc.createElement('span');
  lang.textContent = block.lang || 'code';
  const copy = doc.createElement('button');
  copy.type = 'button';
  copy.className = 'copy';
  copy.textContent = 'Copy';
  copy.addEventListener('click', () => copyText(block.text, copy));
  bar.append(lang, copy);
  const pre = doc.createElement('pre');
  const code = doc.createElement('code');
  code.textContent = block.text;
  pre.append(code);
  figure.append(bar, pre);
  return figure;
}

async function copyText(text, button) {
  try {
    await navigator.clipboard.writeText(text);
    button.textContent = 'Copied';
  } catch {
    button.textContent = 'Copy failed';
  }
  setTimeout(() => (button.textContent = 'Copy'), 1500);
}
