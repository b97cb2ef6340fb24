//! Grammars compiled once per model: llguidance's parser factory over the model's tokens, and a
//! small cache of compiled parsers keyed by grammar (an agent sends the same schema with every
//! request; compiling a large one takes milliseconds).

use super::grammar::{Activation, GrammarRequest, Trigger};
use super::prefix::PrefixPattern;
use super::token_env::TokenEnv;
use crate::error::CoreError;
use crate::tokenizer::Tokenizer;
use llguidance::{Matcher, ParserFactory, TokenParser};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

/// Distinct grammars kept compiled per model.
const CACHED_GRAMMARS: usize = 64;

/// Compiles grammars for one model (one tokenizer, one logits width).
pub struct GrammarCompiler {
    factory: Arc<ParserFactory>,
    /// The model's tokens (the factory's; lazy grammars' trigger tokens are looked up in it).
    env: Arc<TokenEnv>,
    /// Most recently used last.
    cache: Mutex<VecDeque<(String, CompiledGrammar)>>,
}

/// A grammar compiled for a model: each request starts a matcher from it.
#[derive(Clone)]
pub struct CompiledGrammar {
    parser: Arc<Mutex<TokenParser>>,
    /// The request parameter it came from (errors name it).
    param: &'static str,
    /// What starts it when it is lazy (`None`: it constrains the whole answer).
    triggers: Option<Arc<LazyStart>>,
    /// The model's tokens (a lazy grammar reads the text of the tokens before its trigger).
    env: Arc<TokenEnv>,
}

/// A lazy grammar's triggers ([`Trigger`]), compiled for the model.
#[derive(Debug, Default)]
pub(super) struct LazyStart {
    pub tokens: Vec<u32>,
    pub prefixes: Vec<PrefixPattern>,
}

impl std::fmt::Debug for CompiledGrammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompiledGrammar").field("param", &self.param).finish_non_exhaustive()
    }
}

impl CompiledGrammar {
    /// A matcher at the start of the grammar.
    pub(super) fn matcher(&self) -> Matcher {
        let parser = match self.parser.lock() {
            Ok(parser) => parser.deep_clone(),
            Err(poisoned) => poisoned.into_inner().deep_clone(),
        };
        Matcher::new(Ok(parser))
    }

    pub fn param(&self) -> &'static str {
        self.param
    }

    /// A lazy grammar's triggers (`None`: it constrains the whole answer).
    pub(super) fn triggers(&self) -> Option<&LazyStart> {
        self.triggers.as_deref()
    }

    /// The bytes of `token` (a special token's with llguidance's marker byte first).
    pub(super) fn token_bytes(&self, token: u32) -> Vec<u8> {
        use llguidance::toktrie::TokenizerEnv;
        self.env.tok_trie().decode_raw(&[token])
    }
}

impl GrammarCompiler {
    /// The compiler for a model with this tokenizer and logits rows `n_logits` wide (building the
    /// token trie reads every token once: tens of milliseconds for a 150k vocabulary).
    pub fn new(tokenizer: &Tokenizer, n_logits: usize) -> Result<Self, CoreError> {
        let env = Arc::new(TokenEnv::new(tokenizer, n_logits));
        let mut factory = ParserFactory::new_simple(&(env.clone() as llguidance::toktrie::TokEnv))
            .map_err(|e| CoreError::InvalidArgument(format!("structured output cannot use this tokenizer: {e}")))?;
        factory.quiet();
        Ok(GrammarCompiler { factory: Arc::new(factory), env, cache: Mutex::new(VecDeque::new()) })
    }

    /// The grammar compiled for this model; a grammar llguidance cannot compile (a schema keyword
    /// it does not support under `strict`, a bad regex, a Lark syntax error) is a
    /// [`CoreError::BadRequest`] naming the request parameter and llguidance's reason.
    pub fn compile(&self, request: &GrammarRequest) -> Result<CompiledGrammar, CoreError> {
        let triggers = match &request.activation {
            Activation::Always => None,
            Activation::Lazy(triggers) => {
                let mut start = LazyStart::default();
                for trigger in triggers {
                    match trigger {
                        Trigger::Token(text) => {
                            start.tokens.push(self.env.tokenizer().token_id(text).ok_or_else(|| {
                                request.error(format!("'{text}' is not a single token of this model"))
                            })?)
                        }
                        Trigger::Prefix(pattern) => {
                            start.prefixes.push(PrefixPattern::new(pattern).map_err(|e| request.error(e))?)
                        }
                    }
                }
                Some(Arc::new(start))
            }
        };
        let key = request.cache_key();
        {
            let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(at) = cache.iter().position(|(k, _)| *k == key) {
                let entry = cache.remove(at).expect("the position is in the cache");
                let compiled = entry.1.clone();
                cache.push_back(entry);
                return Ok(CompiledGrammar { param: request.param, triggers, ..compiled });
            }
        }
        let parser = self.factory.create_parser(request.top_level()?).map_err(|e| request.error(e))?;
        let compiled = CompiledGrammar {
            parser: Arc::new(Mutex::new(parser)),
            param: request.param,
            triggers,
            env: self.env.clone(),
        };
        // A grammar that compiles may still fail when its lexer is first built: start a matcher
        // now so that such a grammar is refused with the request, not mid-answer.
        let mut probe = compiled.matcher();
        if let Err(e) = probe.compute_mask() {
            return Err(request.error(e));
        }
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if cache.len() == CACHED_GRAMMARS {
            cache.pop_front();
        }
        cache.push_back((key, compiled.clone()));
        Ok(compiled)
    }
}
