//! Structured output: a request's answer constrained to a JSON Schema, a regular expression, a
//! Lark grammar or a fixed set of strings, by masking at every step the tokens that cannot
//! continue it ([llguidance](https://github.com/guidance-ai/llguidance)'s Earley parser over a
//! trie of the model's own token bytes).
//!
//! - [`Grammar`]: what a request asks for (the one request schema fills it from OpenAI's
//!   `response_format`, vLLM's `structured_outputs`, llama-server's `json_schema`/`grammar`,
//!   WebLLM's shapes and `hearth run`'s flags).
//! - [`GrammarCompiler`]: one per model; compiles a grammar once (cached) into a
//!   [`CompiledGrammar`], refusing what it cannot support with a 400-class error naming the
//!   request parameter.
//! - [`GrammarState`]: one per constrained request, in the scheduler's request state: the mask of
//!   its next token, advanced by each accepted token.

mod compiler;
mod gbnf;
mod grammar;
mod prefix;
mod state;
mod token_env;

pub use compiler::{CompiledGrammar, GrammarCompiler};
pub use gbnf::gbnf_to_lark;
pub use grammar::{Activation, Grammar, GrammarRequest, Trigger, PREFIX_WINDOW};
pub use prefix::{PrefixMatch, PrefixPattern};
pub use state::{ConstraintStats, GrammarState, GrammarUsage};
