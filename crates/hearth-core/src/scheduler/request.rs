//! One request's life inside the scheduler: the tokens it must hold in KV (prompt + sampled),
//! its sampler, streamed text and timings.

use super::drafts::RequestDrafts;
use super::forced::ForcedDrafts;
use crate::backend::Readback;
use crate::constraint::GrammarState;
use crate::engine::Instant;
use crate::engine::{FinishReason, GenerateOptions, Generation, TextStream, Timings};
use crate::kv::SeqId;
use crate::sampling::{Sampler, TokenLogprob};
use crate::tokenizer::Tokenizer;

pub type RequestId = u64;

/// The fewest candidates a constrained row reads back (on a GPU, far less than its whole row):
/// the grammar's allowed tokens are usually among the model's top 64.
pub const CONSTRAINED_CANDIDATES: usize = 64;

pub(super) struct Active {
    pub id: RequestId,
    pub seq: Option<SeqId>,
    pub prompt_len: usize,
    /// Prompt then sampled tokens: everything that belongs in the KV cache, in order.
    pub tokens: Vec<u32>,
    pub options: GenerateOptions,
    pub sampler: Sampler,
    pub stream: TextStream,
    pub submitted: Instant,
    pub admitted: Option<Instant>,
    /// Prompt tokens found in the KV/prefix cache at (first) admission.
    pub cached_tokens: Option<usize>,
    pub prompt_ms: f64,
    pub ttft_ms: f64,
    pub last_token: Option<Instant>,
    pub itl_ms: Vec<f64>,
    pub decode_started: Option<Instant>,
    /// Times it was preempted (its KV dropped, to be recomputed).
    pub preemptions: usize,
    /// The log-probability of the token sampled last, until [`Self::accept`] keeps it.
    pub pending_logprob: Option<TokenLogprob>,
    /// One per output token when the request asks for them; the first `logprobs_sent` went out
    /// with text events.
    pub logprobs: Vec<TokenLogprob>,
    pub logprobs_sent: usize,
    /// With [`GenerateOptions::prompt_logprobs`]: entry `k` is prompt token `k + 1`'s, scored
    /// from the row of position `k`.
    pub prompt_logprobs: Vec<TokenLogprob>,
    /// Whether [`super::SchedulerEvent::PromptScored`] went out (once, even if preempted).
    pub prompt_scores_sent: bool,
    /// Its drafter and draft policy, when it speculates.
    pub drafts: Option<Box<RequestDrafts>>,
    /// The first choice of the same prompt (`n` > 1): admitted once that one holds the prompt
    /// in KV, sharing its blocks.
    pub shares_prompt_of: Option<RequestId>,
    /// Its grammar's state when its answer is constrained ([`GenerateOptions::grammar`]).
    pub grammar: Option<GrammarState>,
    /// Its next row reads the whole logits: its grammar allowed too few of the last step's
    /// candidates (the row is evaluated again).
    pub full_logits_next: bool,
    /// The tokens its grammar forces, when the step verifies them.
    pub forced: ForcedDrafts,
}

impl Active {
    pub fn new(id: RequestId, prompt: Vec<u32>, options: GenerateOptions) -> Self {
        let sampler = Sampler::new(options.sampling.clone());
        let stream = TextStream::new(&options.stop, options.ignore_eos);
        let forced = ForcedDrafts::new(options.sampling.seed);
        Active {
            id,
            seq: None,
            prompt_len: prompt.len(),
            tokens: prompt,
            options,
            sampler,
            stream,
            submitted: Instant::now(),
            admitted: None,
            cached_tokens: None,
            prompt_ms: 0.0,
            ttft_ms: 0.0,
            last_token: None,
            itl_ms: Vec::new(),
            decode_started: None,
            preemptions: 0,
            pending_logprob: None,
            logprobs: Vec::new(),
            logprobs_sent: 0,
            prompt_logprobs: Vec::new(),
            prompt_scores_sent: false,
            drafts: None,
            shares_prompt_of: None,
            grammar: None,
            full_logits_next: false,
            forced,
        }
    }

    pub fn generated(&self) -> usize {
        self.tokens.len() - self.prompt_len
    }

    /// Records a sampled token; the text it releases and whether the request ends.
    pub fn accept(&mut self, tokenizer: &Tokenizer, token: u32, n_ctx: usize) -> (String, Option<FinishReason>) {
        let now = Instant::now();
        match self.last_token {
            None => {
                self.ttft_ms = ms_between(self.submitted, now);
                self.decode_started = Some(now);
            }
            Some(last) => self.itl_ms.push(ms_between(last, now)),
        }
        self.last_token = Some(now);
        let logprob = self.pending_logprob.take().filter(|l| l.token == token);
        let kept_before = self.stream.tokens.len();
        let (emit, finish) = self.stream.push(tokenizer, token);
        // (An end-of-generation token is not part of the output, nor is its log-probability.)
        if self.stream.tokens.len() > kept_before {
            self.logprobs.extend(logprob);
        }
        if finish.is_some() {
            return (emit, finish);
        }
        self.tokens.push(token);
        if self.generated() >= self.options.max_tokens {
            return (emit, Some(FinishReason::Length));
        }
        if self.tokens.len() >= n_ctx {
            return (emit, Some(FinishReason::ContextFull));
        }
        (emit, None)
    }

    /// What a token's row reads back for this request: what its sampler needs, and the row's
    /// log-sum-exp and top candidates when it reports log-probabilities. A constrained request
    /// reads at least [`CONSTRAINED_CANDIDATES`], enough when its grammar allows as many of them
    /// as its sampler needs (the top allowed tokens are then all among them); else, and when
    /// its sampler needs the whole row, it reads the whole row.
    pub fn row_readback(&self) -> Readback {
        let sampling = self.sampler.readback(&self.tokens);
        let sampling = match (&self.grammar, sampling) {
            (Some(grammar), _) if grammar.is_active() && self.full_logits_next => Readback::Logits,
            (Some(grammar), Readback::TopK(k)) if grammar.is_active() => Readback::TopK(k.max(CONSTRAINED_CANDIDATES)),
            (_, sampling) => sampling,
        };
        match self.options.logprobs {
            Some(n) => sampling.union(Readback::TopKAndLogSumExp(n.max(1))),
            None => sampling,
        }
    }

    /// Whether the step evaluating `range` of its tokens scores prompt tokens (reads every row).
    pub fn scores_prompt(&self, range: &std::ops::Range<usize>) -> bool {
        self.options.prompt_logprobs.is_some() && range.start + 1 < self.prompt_len
    }

    /// Keeps the log-probabilities of the prompt tokens that positions `range` predict, from
    /// their rows' logits `[range.len(), n_vocab]` (once each: a preempted request evaluates its
    /// prompt again).
    pub fn score_prompt(&mut self, range: std::ops::Range<usize>, logits: &[f32], n_vocab: usize) {
        let Some(top) = self.options.prompt_logprobs else { return };
        for (row, position) in range.enumerate() {
            if position == self.prompt_logprobs.len() && position + 1 < self.prompt_len {
                let target = self.tokens[position + 1];
                let row_logits = &logits[row * n_vocab..(row + 1) * n_vocab];
                self.prompt_logprobs.push(TokenLogprob::from_logits(row_logits, target, top));
            }
        }
    }

    /// The log-probabilities kept since the last call (for a text event).
    pub fn unsent_logprobs(&mut self) -> Vec<TokenLogprob> {
        let unsent = self.logprobs[self.logprobs_sent.min(self.logprobs.len())..].to_vec();
        self.logprobs_sent = self.logprobs.len();
        unsent
    }

    /// The final result; the tail of held-back text is returned separately for streaming.
    pub fn finish(self, reason: FinishReason) -> (String, Generation) {
        let decode_ms = self.decode_started.map_or(0.0, |t| ms_between(t, Instant::now()));
        let evaluated = self.prompt_len - self.cached_tokens.unwrap_or(0).min(self.prompt_len);
        let timings = Timings::new(evaluated, self.prompt_ms, self.ttft_ms, decode_ms, self.itl_ms);
        let prompt_tokens = self.tokens[..self.prompt_len].to_vec();
        let (tail, tokens, text) = self.stream.finish();
        let logprobs = self.options.logprobs.map(|_| self.logprobs);
        let prompt_logprobs = self.options.prompt_logprobs.map(|_| self.prompt_logprobs);
        let generation = Generation {
            prompt_tokens,
            tokens,
            text,
            finish_reason: reason,
            timings,
            speculative: None,
            logprobs,
            prompt_logprobs,
            constraint: self.grammar.map(GrammarState::into_stats),
        };
        (tail, generation)
    }
}

fn ms_between(a: Instant, b: Instant) -> f64 {
    b.duration_since(a).as_secs_f64() * 1e3
}
