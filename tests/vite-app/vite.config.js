// hearth-llm starts its worker with `new Worker(new URL('./worker.js', import.meta.url), { type: 'module' })`
// and the worker imports ES modules, so the worker bundle must be an ES module too.
export default { worker: { format: 'es' }, build: { target: 'es2022' } };
