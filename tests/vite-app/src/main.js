import { createEngine } from 'hearth-llm';

const out = document.getElementById('out');
document.getElementById('run').addEventListener('click', async () => {
  const engine = await createEngine({ model: document.getElementById('model').value, onProgress: ({ phase }) => (out.textContent = phase) });
  out.textContent = 'def fibonacci(n):';
  for await (const chunk of await engine.completions.create({ prompt: 'def fibonacci(n):', stream: true, temperature: 0, max_tokens: 32 })) {
    out.textContent += chunk.choices[0].text;
  }
});
