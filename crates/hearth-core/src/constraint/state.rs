//! One constrained request's grammar state: the mask of its next token, advanced by every token
//! it keeps and rolled back with its KV cache.

use super::compiler::CompiledGrammar;
use super::grammar::PREFIX_WINDOW;
use super::prefix::PrefixMatch;
use crate::engine::Instant;
use crate::error::CoreError;
use llguidance::toktrie::SimpleVob;
use llguidance::Matcher;

/// What constraining a request cost and saved, reported with its generation.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct ConstraintStats {
    /// Time each of its masks took to compute, in microseconds (one per sampled token, and one
    /// per verified draft).
    pub mask_us: Vec<f32>,
    /// Tokens the grammar forced that the model kept (verified in the pass of the token before
    /// them: no step of their own).
    pub forced_tokens: usize,
    /// Time compiling the grammar took (0 when the compiler's cache had it), in microseconds.
    pub compile_us: f32,
    /// Rows whose allowed tokens were too few among the device's top candidates: evaluated again
    /// for their whole logits.
    pub full_logits_rows: usize,
}

impl ConstraintStats {
    pub fn masks(&self) -> usize {
        self.mask_us.len()
    }

    /// The mean time of a mask (0 without masks).
    pub fn mask_mean_us(&self) -> f32 {
        if self.mask_us.is_empty() {
            return 0.0;
        }
        self.mask_us.iter().sum::<f32>() / self.mask_us.len() as f32
    }

    /// The mask time below which a fraction `q` of the masks took (0 without masks).
    pub fn mask_percentile_us(&self, q: f64) -> f32 {
        let mut sorted = self.mask_us.clone();
        sorted.sort_by(f32::total_cmp);
        let rank = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len().max(1)) - 1;
        sorted.get(rank).copied().unwrap_or(0.0)
    }
}

/// What structured output cost a request's choices, as `usage.grammar` reports it (the server's
/// and the browser's).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct GrammarUsage {
    pub masks: usize,
    pub forced_tokens: usize,
    pub mask_mean_us: f32,
    pub mask_p50_us: f32,
    pub mask_p99_us: f32,
    /// The grammar's compile time (the longest over choices).
    pub compile_us: f32,
    pub full_logits_rows: usize,
}

impl GrammarUsage {
    /// Over the masks of every constrained choice; `None` when none was constrained.
    pub fn of<'a>(choices: impl IntoIterator<Item = &'a ConstraintStats>) -> Option<Self> {
        let mut all = ConstraintStats::default();
        let mut constrained = false;
        for stats in choices {
            constrained = true;
            all.mask_us.extend(&stats.mask_us);
            all.forced_tokens += stats.forced_tokens;
            all.compile_us = all.compile_us.max(stats.compile_us);
            all.full_logits_rows += stats.full_logits_rows;
        }
        constrained.then(|| GrammarUsage {
            masks: all.masks(),
            forced_tokens: all.forced_tokens,
            mask_mean_us: all.mask_mean_us(),
            mask_p50_us: all.mask_percentile_us(0.5),
            mask_p99_us: all.mask_percentile_us(0.99),
            compile_us: all.compile_us,
            full_logits_rows: all.full_logits_rows,
        })
    }
}

/// A request's position in its grammar.
pub struct GrammarState {
    phase: Phase,
    /// Drafts consumed to mask verification rows, rolled back after ([`Self::end_speculation`]).
    speculated: usize,
    param: &'static str,
    stats: ConstraintStats,
    /// The mask of the current position, computed ahead ([`Self::prepare_mask`]); any move of
    /// the matcher drops it.
    prepared: Option<Result<SimpleVob, CoreError>>,
}

enum Phase {
    /// A lazy grammar before its trigger: the answer is free.
    Waiting(Box<Waiting>),
    Matching(Box<Matcher>),
    /// The answer did not begin the grammar: it is free to its end.
    Free,
}

/// A lazy grammar waiting for its trigger.
struct Waiting {
    grammar: CompiledGrammar,
    /// The answer's tokens and text while a prefix trigger may still match its beginning (`None`
    /// once none can).
    beginning: Option<(Vec<u32>, Vec<u8>)>,
}

impl Waiting {
    /// Takes the answer's next token; returns the tokens the grammar starts with when this one
    /// triggers it (a trigger token; or the answer so far, whose beginning a prefix matches).
    fn advance(&mut self, token: u32) -> Option<Vec<u32>> {
        let start = self.grammar.triggers()?;
        if start.tokens.contains(&token) {
            return Some(vec![token]);
        }
        let (tokens, text) = self.beginning.as_mut()?;
        tokens.push(token);
        text.extend(self.grammar.token_bytes(token));
        let checks: Vec<PrefixMatch> = start.prefixes.iter().map(|prefix| prefix.check(text)).collect();
        if checks.contains(&PrefixMatch::Matched) {
            // (Once: where the grammar does not accept the answer so far, no prefix starts it.)
            return self.beginning.take().map(|(tokens, _)| tokens);
        }
        if !checks.contains(&PrefixMatch::Undecided) || text.len() > PREFIX_WINDOW {
            self.beginning = None;
        }
        None
    }

    /// Whether nothing can trigger the grammar any more.
    fn is_over(&self) -> bool {
        self.beginning.is_none() && self.grammar.triggers().is_none_or(|start| start.tokens.is_empty())
    }

    /// How many of `drafts` may be verified before the grammar could start (its masks are needed
    /// from there on).
    fn free_drafts(&self, drafts: &[u32]) -> usize {
        if self.beginning.is_some() {
            return 0;
        }
        let tokens = self.grammar.triggers().map_or(&[][..], |start| &start.tokens[..]);
        drafts.iter().position(|t| tokens.contains(t)).unwrap_or(drafts.len())
    }
}

impl GrammarState {
    /// `compile_us`: what compiling `grammar` took (reported in its stats).
    pub fn new(grammar: &CompiledGrammar, compile_us: f32) -> Self {
        let phase = match grammar.triggers() {
            None => Phase::Matching(Box::new(grammar.matcher())),
            Some(start) => Phase::Waiting(Box::new(Waiting {
                grammar: grammar.clone(),
                beginning: (!start.prefixes.is_empty()).then(Default::default),
            })),
        };
        GrammarState {
            phase,
            speculated: 0,
            param: grammar.param(),
            stats: ConstraintStats { compile_us, ..Default::default() },
            prepared: None,
        }
    }

    fn failure(&self, message: impl std::fmt::Display) -> CoreError {
        CoreError::Constraint { param: self.param, message: message.to_string() }
    }

    /// Whether the grammar constrains the next token (a lazy one only after its trigger).
    pub fn is_active(&self) -> bool {
        matches!(self.phase, Phase::Matching(_))
    }

    /// The tokens the grammar allows next (`None` when it does not constrain the next token):
    /// once the answer is complete, only end-of-generation. Computed once per position (kept
    /// until the matcher moves). A grammar that allows no token at all (a dead end: the model's
    /// vocabulary cannot spell what it requires) or fails is a [`CoreError::Constraint`].
    fn mask(&mut self) -> Result<Option<&SimpleVob>, CoreError> {
        if !matches!(self.phase, Phase::Matching(_)) {
            return Ok(None);
        }
        if self.prepared.is_none() {
            self.prepared = self.compute_mask().transpose();
        }
        if let Some(Err(_)) = self.prepared {
            let Some(Err(error)) = self.prepared.take() else { unreachable!("matched above") };
            return Err(error);
        }
        Ok(self.prepared.as_ref().and_then(|mask| mask.as_ref().ok()))
    }

    fn compute_mask(&mut self) -> Result<Option<SimpleVob>, CoreError> {
        let Phase::Matching(matcher) = &mut self.phase else { return Ok(None) };
        let started = Instant::now();
        let mask = matcher.compute_mask_or_eos();
        self.stats.mask_us.push((started.elapsed().as_secs_f64() * 1e6) as f32);
        let mask = mask.map_err(|e| self.failure(e))?;
        if mask.is_zero() {
            return Err(self.failure("no token of the model's vocabulary can continue the answer"));
        }
        Ok(Some(mask))
    }

    /// Computes the mask of the next token now, for the next [`Self::mask_logits`] (the scheduler
    /// calls it while the device runs the step whose logits it masks).
    pub fn prepare_mask(&mut self) {
        if self.prepared.is_none() && self.speculated == 0 {
            self.prepared = self.compute_mask().transpose();
        }
    }

    /// Sets the logits (one row, `[n_logits]`) of the tokens the grammar does not allow next to
    /// `-inf`, so that every sampler filter and the temperature see only allowed tokens.
    pub fn mask_logits(&mut self, logits: &mut [f32]) -> Result<(), CoreError> {
        let Some(mask) = self.mask()? else { return Ok(()) };
        for (word_index, &word) in mask.as_slice().iter().enumerate() {
            if word == u32::MAX {
                continue;
            }
            let start = word_index * 32;
            let Some(span) = logits.get_mut(start..(start + 32).min(logits.len())) else { break };
            if word == 0 {
                span.fill(f32::NEG_INFINITY);
                continue;
            }
            for (bit, logit) in span.iter_mut().enumerate() {
                if word & (1 << bit) == 0 {
                    *logit = f32::NEG_INFINITY;
                }
            }
        }
        Ok(())
    }

    /// The candidates (`ids`, most likely first, with their `logits`) the grammar allows next, in
    /// `kept_ids` / `kept_logits`; all of them when it does not constrain the next token.
    pub fn allowed_candidates(
        &mut self,
        (ids, logits): (&[u32], &[f32]),
        kept_ids: &mut Vec<u32>,
        kept_logits: &mut Vec<f32>,
    ) -> Result<(), CoreError> {
        kept_ids.clear();
        kept_logits.clear();
        let mask = self.mask()?;
        for (&id, &logit) in ids.iter().zip(logits) {
            if mask.is_none_or(|m| m.is_allowed(id)) {
                kept_ids.push(id);
                kept_logits.push(logit);
            }
        }
        Ok(())
    }

    /// Counts a row whose allowed tokens were not among its candidates (evaluated again for its
    /// whole logits).
    pub fn count_full_logits_row(&mut self) {
        self.stats.full_logits_rows += 1;
    }

    /// Advances past a token the request keeps (one the last mask allowed); a lazy grammar
    /// starts matching at its trigger.
    pub fn accept(&mut self, token: u32) -> Result<(), CoreError> {
        self.prepared = None;
        match &mut self.phase {
            Phase::Waiting(waiting) => {
                if let Some(tokens) = waiting.advance(token) {
                    let mut matcher = waiting.grammar.matcher();
                    if matcher.validate_tokens(&tokens).unwrap_or(0) == tokens.len()
                        && matcher.consume_tokens(&tokens).is_ok()
                    {
                        self.phase = Phase::Matching(Box::new(matcher));
                        return Ok(());
                    }
                }
                if waiting.is_over() {
                    self.phase = Phase::Free;
                }
                Ok(())
            }
            Phase::Matching(matcher) => {
                let consumed = matcher.consume_token(token);
                consumed.map_err(|e| self.failure(e))
            }
            Phase::Free => Ok(()),
        }
    }

    /// The tokens the grammar forces next (it allows no other text), as the tokenizer spells
    /// that text, without consuming them: drafts to verify ([`crate::scheduler`]). None before a
    /// lazy grammar's trigger, once the answer is complete, or for a tokenizer whose encoding of
    /// a continuation is not canonical. (llguidance leaves out the forced text's last bytes when
    /// a longer token could begin with them.)
    pub fn forced_tokens(&mut self) -> Vec<u32> {
        match &mut self.phase {
            Phase::Matching(matcher) if !matcher.is_stopped() => matcher.compute_ff_tokens(),
            _ => Vec::new(),
        }
    }

    /// Counts forced tokens the model kept.
    pub fn count_forced(&mut self, kept: usize) {
        self.stats.forced_tokens += kept;
    }

    /// How many of `drafts` (after the tokens accepted so far), in order, the grammar allows:
    /// the drafts a speculative step may verify. A lazy grammar before its trigger allows the
    /// drafts before a trigger token, and none while a prefix may still start it (the rows after
    /// a trigger would need the grammar's masks).
    pub fn valid_prefix(&mut self, drafts: &[u32]) -> usize {
        match &mut self.phase {
            Phase::Waiting(waiting) => waiting.free_drafts(drafts),
            Phase::Matching(matcher) => matcher.validate_tokens(drafts).unwrap_or(0),
            Phase::Free => drafts.len(),
        }
    }

    /// [`Self::mask_logits`] for the row after `drafts` (a prefix of a valid proposal, verified
    /// in order): the grammar advances over them first, to be rolled back by
    /// [`Self::end_speculation`].
    pub fn mask_logits_after(&mut self, drafts: &[u32], logits: &mut [f32]) -> Result<(), CoreError> {
        if let Phase::Matching(matcher) = &mut self.phase {
            while self.speculated < drafts.len() {
                self.prepared = None;
                let consumed = matcher.consume_token(drafts[self.speculated]);
                consumed.map_err(|e| CoreError::Constraint { param: self.param, message: e.to_string() })?;
                self.speculated += 1;
            }
        }
        self.mask_logits(logits)
    }

    /// Forgets the drafts consumed to mask verification rows.
    pub fn end_speculation(&mut self) -> Result<(), CoreError> {
        let speculated = std::mem::take(&mut self.speculated);
        if speculated > 0 {
            self.prepared = None;
        }
        match &mut self.phase {
            Phase::Matching(matcher) if speculated > 0 => {
                let rolled = matcher.rollback(speculated);
                rolled.map_err(|e| self.failure(e))
            }
            _ => Ok(()),
        }
    }

    /// Whether the answer is complete: the grammar allows nothing after it.
    pub fn is_complete(&self) -> bool {
        match &self.phase {
            Phase::Matching(matcher) => matcher.is_stopped() && !matcher.is_error(),
            Phase::Waiting(_) | Phase::Free => false,
        }
    }

    /// Whether the grammar accepts `tokens` whole, as a complete answer (consumes them).
    pub fn accepts(&mut self, tokens: &[u32]) -> bool {
        self.prepared = None;
        for (i, &token) in tokens.iter().enumerate() {
            if let Phase::Matching(matcher) = &mut self.phase {
                let rest = &tokens[i..];
                return matches!(matcher.try_consume_tokens(rest), Ok(n) if n == rest.len())
                    && matcher.is_accepting().unwrap_or(false);
            }
            if self.accept(token).is_err() {
                return false;
            }
        }
        match &mut self.phase {
            Phase::Matching(matcher) => matcher.is_accepting().unwrap_or(false),
            Phase::Waiting(_) | Phase::Free => true,
        }
    }

    pub fn into_stats(self) -> ConstraintStats {
        self.stats
    }
}
