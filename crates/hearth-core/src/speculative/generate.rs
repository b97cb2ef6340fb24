//! `Engine::generate_speculative`: the decode loop of `Engine::generate` with draft-and-verify steps.
//!
//! Invariant between steps: the target's KV cache holds every accepted token except the last one
//! (`pending`), which is evaluated together with the next draft, so one forward pass of
//! `1 + k` tokens yields the logits for all k draft positions and the bonus position.

use super::catch_up::CatchUp;
use super::verify::{verification_rng, verify_proposal, Distribution};
use super::{Drafter, PolicyMemory, Proposal, SpeculativeMetrics, SpeculativeOptions};
use crate::backend::Readback;
use crate::block_on::block_on;
use crate::engine::{ms, Engine, FinishReason, GenerateOptions, Generation, Instant, TextOutput, Timings};
use crate::error::{CoreError, Result};
use crate::runner::{StepOutput, ROLLBACK_MARGIN};
use crate::sampling::Sampler;

impl Engine {
    /// Like [`Engine::generate`], with `drafter` proposing up to `speculative.max_draft_tokens`
    /// tokens per target forward pass. Greedy output is identical to `generate`'s; with sampling
    /// the output follows the same distribution (not the same tokens for a given seed).
    /// Synchronous: [`Engine::generate_speculative_async`] polled once (see [`crate::block_on`]).
    pub fn generate_speculative(
        &mut self,
        prompt: &[u32],
        options: &GenerateOptions,
        drafter: &mut dyn Drafter,
        speculative: &SpeculativeOptions,
        on_text: &mut dyn FnMut(&str) -> bool,
    ) -> Result<Generation> {
        block_on(self.generate_speculative_async(prompt, options, drafter, speculative, on_text))
    }

    /// [`Engine::generate_speculative`] for backends whose logits arrive later (WebGPU in a
    /// browser): the target's forward passes and the drafter's proposals
    /// ([`Drafter::propose_async`]: a [`DraftModel`](super::DraftModel) awaits its own passes, so
    /// it may run on WebGPU too) are awaited.
    pub async fn generate_speculative_async(
        &mut self,
        prompt: &[u32],
        options: &GenerateOptions,
        drafter: &mut dyn Drafter,
        speculative: &SpeculativeOptions,
        on_text: &mut dyn FnMut(&str) -> bool,
    ) -> Result<Generation> {
        self.generate_speculative_with_async(
            prompt,
            options,
            drafter,
            speculative,
            &mut PolicyMemory::default(),
            on_text,
        )
        .await
    }

    /// [`Engine::generate_speculative`] starting from what `memory` kept of the last generation
    /// with the same drafter and options (a chat's earlier turn: measured pass costs, how far
    /// copies run), and keeping what this one learns. Synchronous: the async form polled once.
    pub fn generate_speculative_with(
        &mut self,
        prompt: &[u32],
        options: &GenerateOptions,
        drafter: &mut dyn Drafter,
        speculative: &SpeculativeOptions,
        memory: &mut PolicyMemory,
        on_text: &mut dyn FnMut(&str) -> bool,
    ) -> Result<Generation> {
        block_on(self.generate_speculative_with_async(prompt, options, drafter, speculative, memory, on_text))
    }

    /// [`Engine::generate_speculative_with`] for backends whose logits arrive later.
    #[allow(clippy::too_many_arguments)]
    pub async fn generate_speculative_with_async(
        &mut self,
        prompt: &[u32],
        options: &GenerateOptions,
        drafter: &mut dyn Drafter,
        speculative: &SpeculativeOptions,
        memory: &mut PolicyMemory,
        on_text: &mut dyn FnMut(&str) -> bool,
    ) -> Result<Generation> {
        let (session, tokenizer) = self.parts_mut();
        crate::engine::refuse_logprobs(options)?;
        if prompt.is_empty() {
            return Err(CoreError::InvalidArgument("the prompt is empty".into()));
        }
        if prompt.len() >= session.n_ctx() {
            return Err(CoreError::ContextOverflow { needed: prompt.len() + 1, capacity: session.n_ctx() });
        }
        let start = Instant::now();
        // The prompt is evaluated exactly as `generate` does it (same batches, so the same
        // numerics: the CPU backend's attention path depends on the batch size), and the first
        // token is sampled from it; drafting starts after it.
        let mut sampler = Sampler::new(options.sampling.clone());
        let common = session.prepare_prompt(prompt)?;
        let first = session.eval_for_async(&prompt[common..], sampler.readback(prompt)).await?;
        let first_token = match first {
            StepOutput::Logits(logits) => sampler.sample(&mut logits.to_vec(), prompt),
            StepOutput::TopK(top) => {
                let (ids, logits) = if top.n_rows() > 0 { top.row(0) } else { (&[][..], &[][..]) };
                sampler.sample_candidates(ids, logits, prompt)
            }
        };
        let prompt_ms = ms(start);
        let mut output = TextOutput::new(tokenizer, &options.stop, options.ignore_eos, on_text);
        // Prompt and accepted output; its last token is the pending one.
        let mut context = prompt.to_vec();
        // The first token goes out before the drafter reads the prompt (a draft model's prefill,
        // ~0.4 s for Qwen2.5-Coder-0.5B on 2 CPU cores): that read delays the second token, not
        // the first. It happens before the steps, which the draft policy times: they carry only
        // drafting.
        let (mut ttft_ms, mut ended) = (0.0, None);
        if options.max_tokens > 0 {
            ttft_ms = ms(start);
            context.push(first_token);
            ended = output.push(first_token);
        }
        let mut last = Instant::now();
        let decode_start = last;
        let mut drafter_prepare_ms = 0.0;
        if ended.is_none() && output.tokens().len() < options.max_tokens {
            drafter.prepare_async(prompt).await?;
            drafter_prepare_ms = ms(last);
        }

        let mut rng = verification_rng(options.sampling.seed);
        // The drafter's policy and, for a `LookupThen`, the free drafts' own (lookup's proposals
        // cost nothing, unlike the costly drafter's): from what an earlier generation learnt.
        let free_limit = drafter.free_proposal_limit();
        let (mut policy, mut free_policy) = memory.policies(speculative, free_limit);
        // When the costly drafter drafts again after free drafts (it must first read what they copied).
        let mut catch_up = CatchUp::new(prompt.len());
        let mut metrics = SpeculativeMetrics { drafter_prepare_ms, ..SpeculativeMetrics::default() };
        // `context` plus the drafts before the row being verified (penalties look at it).
        let mut history = Vec::new();
        let mut row_scratch = Vec::new();
        let (n_vocab, n_logits) = (session.config().n_vocab, session.config().n_logits);
        let mut itl_ms = Vec::new();
        // Tokens chosen but not yet passed to the output.
        let mut new_tokens = Vec::new();
        let finish = 'steps: loop {
            if let Some(reason) = ended.take() {
                break reason;
            }
            if output.tokens().len() >= options.max_tokens {
                break FinishReason::Length;
            }
            for token in new_tokens.drain(..) {
                itl_ms.push(ms(last));
                last = Instant::now();
                context.push(token);
                if let Some(reason) = output.push(token) {
                    break 'steps reason;
                }
                if output.tokens().len() >= options.max_tokens {
                    break 'steps FinishReason::Length;
                }
            }
            if session.remaining() == 0 {
                break FinishReason::ContextFull;
            }
            // Each step yields accepted + 1 tokens and evaluates 1 + verified drafts.
            // (At most ROLLBACK_MARGIN drafts: rejected ones are rolled back, and a sliding-window
            // model keeps only that many positions past its window.)
            let room =
                (options.max_tokens - output.tokens().len() - 1).min(session.remaining() - 1).min(ROLLBACK_MARGIN);
            // Free drafts first (a `LookupThen`'s prompt lookup): verified as far as that pays,
            // and the costly drafter then sits the step out; else kept to be scored as the
            // target's tokens come.
            let mut proposal = Proposal::default();
            let mut from_free = false;
            let (mut budget, mut verify) = (0, 0);
            // (A fixed draft length keeps the fixed wait: nothing there is judged by its cost.)
            let gain_ms = if speculative.adaptive { policy.drafting_gain_ms() } else { f64::INFINITY };
            let costly_ready = catch_up.costly_ready(context.len(), gain_ms);
            if let Some(free) = free_policy.as_mut() {
                let free_budget = free.request().min(room);
                let drafting = Instant::now();
                let mut free_proposal =
                    if free_budget > 0 { drafter.propose_free(&context, free_budget) } else { Proposal::default() };
                free.observe_draft(free_budget, ms(drafting));
                free_proposal.tokens.truncate(free_budget);
                let (length, matched) = (free_proposal.tokens.len(), free_proposal.matched);
                let free_verify = free.verify_length(length, matched);
                // A guess from a one-token match gives way to a costly drafter ready to draft.
                let yields = costly_ready && matched.unwrap_or(0) < FREE_OVER_COSTLY_MIN_MATCH;
                if free_verify > 0 && !yields {
                    (proposal, from_free, budget, verify) = (free_proposal, true, free_budget, free_verify);
                } else {
                    free.track_unverified(length, matched, 0, &free_proposal.tokens);
                }
            }
            catch_up.start_step(from_free, context.len());
            if !from_free && costly_ready {
                budget = policy.request().min(room);
                let drafting = Instant::now();
                if budget > 0 {
                    proposal = drafter.propose_async(&context, budget, &options.sampling).await?;
                }
                match &proposal.timing {
                    Some(timing) => {
                        policy.observe_draft_timing(timing);
                        catch_up.observe_catch_up(context.len(), ms(drafting) - timing.later_ms);
                    }
                    None => policy.observe_draft(budget, ms(drafting)),
                }
                proposal.tokens.truncate(budget);
                verify = policy.verify_length(proposal.tokens.len(), proposal.matched);
            }
            if let Some(bad) = proposal.tokens.iter().find(|&&t| t as usize >= n_vocab) {
                return Err(CoreError::InvalidArgument(format!(
                    "the drafter proposed token {bad}, outside the vocabulary"
                )));
            }
            // Verify only the drafts that pay at this machine's pass costs; the ones left out
            // are still scored against the target's tokens as they come.
            let (proposed_len, matched) = (proposal.tokens.len(), proposal.matched);
            let unverified = proposal.tokens.split_off(verify.min(proposed_len));
            if let Some(distributions) = proposal.distributions.as_mut() {
                distributions.truncate(verify);
            }
            let kept = context.len() - 1;
            let mut batch = Vec::with_capacity(1 + proposal.tokens.len());
            batch.push(context[kept]);
            batch.extend_from_slice(&proposal.tokens);
            let drafts = &proposal.tokens;
            // Row i predicts the token after context + drafts[..i]: candidates when every row's
            // sampling can use them (greedy: the argmax), the whole rows otherwise.
            let readback = verify_readback(&sampler, &context, drafts);
            // Rows: [batch.len(), n_logits] logits or batch.len() rows of candidates. Read in place
            // (no copy of the k + 1 rows); only the logits rows verification reaches are copied,
            // one at a time, into `row_scratch` for the sampler to modify.
            let pass = Instant::now();
            let output = session.eval_all_for_async(&batch, readback).await?;
            let pass_ms = ms(pass);
            policy.observe_pass(batch.len(), pass_ms);
            if let Some(free) = free_policy.as_mut() {
                free.observe_pass(batch.len(), pass_ms);
            }
            let mut target = |i: usize| -> Result<Distribution> {
                history.clear();
                history.extend_from_slice(&context);
                history.extend_from_slice(&drafts[..i]);
                let missing = || {
                    CoreError::InvalidArgument(format!("the backend returned too few rows for {} tokens", batch.len()))
                };
                match output {
                    StepOutput::Logits(logits) => {
                        let row = logits.get(i * n_logits..(i + 1) * n_logits).ok_or_else(missing)?;
                        row_scratch.clear();
                        row_scratch.extend_from_slice(row);
                        Ok(sampler.distribution(&mut row_scratch, &history))
                    }
                    StepOutput::TopK(top) => {
                        if i >= top.n_rows() {
                            return Err(missing());
                        }
                        let (ids, logits) = top.row(i);
                        Ok(sampler.distribution_candidates(ids, logits, &history))
                    }
                }
            };
            let outcome = verify_proposal(drafts, proposal.distributions.as_deref(), &mut target, &mut rng)?;
            session.rollback(kept + 1 + outcome.accepted)?;
            metrics.record(&outcome);
            if from_free {
                metrics.record_free(&outcome);
            } else {
                catch_up.observe_accepted(outcome.accepted);
            }
            let step_tokens = drafts[..outcome.accepted].iter().copied().chain([outcome.continuation_token]);
            match (from_free, free_policy.as_mut()) {
                (true, Some(free)) => {
                    free.observe_step(&outcome, drafts, &unverified, matched, budget);
                    step_tokens.for_each(|t| policy.observe_token(t));
                }
                (_, free) => {
                    policy.observe_step(&outcome, drafts, &unverified, matched, budget);
                    if let Some(free) = free {
                        step_tokens.for_each(|t| free.observe_token(t));
                    }
                }
            }

            new_tokens.extend_from_slice(&drafts[..outcome.accepted]);
            new_tokens.push(outcome.continuation_token);
        };
        // A stop inside a step leaves accepted drafts beyond the output in the cache: drop them,
        // so the cache is always a prefix of prompt + output.
        let keep = session.history().len().min(prompt.len() + output.tokens().len());
        session.rollback(keep)?;
        let (tokens, text) = output.finish();
        let timings = Timings::new(prompt.len() - common, prompt_ms, ttft_ms, ms(decode_start), itl_ms);
        memory.remember(speculative, free_limit, &policy, free_policy.as_ref());
        Ok(Generation {
            prompt_tokens: prompt.to_vec(),
            tokens,
            text,
            finish_reason: finish,
            timings,
            speculative: Some(metrics),
            logprobs: None,
        })
    }
}

/// Free proposals from matches shorter than this give way to a costly drafter that is ready to
/// draft: a prompt lookup's guess after a one-token match is kept ~30% of the time, a draft
/// model's drafts ~95%. (With the draft model waiting to repay its catch-up, the guesses keep
/// the steps in between from being plain: a 2-row pass costs about a 1-row one on a CPU.)
const FREE_OVER_COSTLY_MIN_MATCH: usize = 2;

/// What a verification step over `drafts` reads back: the candidates of the most demanding row
/// (row i is sampled after `context` + `drafts[..i]`), or the whole rows when one needs them.
pub(crate) fn verify_readback(sampler: &Sampler, context: &[u32], drafts: &[u32]) -> Readback {
    let mut k = 1;
    for i in 0..=drafts.len() {
        match sampler.readback_after(context, &drafts[..i]) {
            Readback::TopK(row_k) | Readback::TopKAndLogSumExp(row_k) => k = k.max(row_k),
            Readback::Logits => return Readback::Logits,
        }
    }
    Readback::TopK(k)
}
