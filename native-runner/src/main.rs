// `fetch` is wired into the CLI commands by main.rs's author; until then it is only exercised by tests.
#[allow(dead_code)]
mod fetch;

fn main() {}
