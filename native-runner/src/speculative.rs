//! The speculative decoding flags of `hearth run` and `hearth chat`: which drafter, and how long
//! its drafts may be.

use crate::load;
use crate::ModelArgs;
use anyhow::{bail, Context, Result};
use clap::Args;
use hearth_core::backend::Backend;
use hearth_core::engine::{Engine, EngineOptions};
use hearth_core::gguf::GgufFile;
use hearth_core::runner::Runner;
use hearth_core::scheduler::Drafting;
use hearth_core::speculative::{default_draft_vocab, BatchedDraftModel, SpeculativeMetrics, SpeculativeOptions};
use hearth_core::tokenizer::Tokenizer;
use std::path::PathBuf;

#[derive(Args, Debug, Clone, Default)]
pub struct SpeculativeArgs {
    /// Speculative decoding with this draft model (a .gguf path or a built-in name); its
    /// vocabulary must match the model's (e.g. qwen2.5-coder-0.5b for qwen2.5-coder-1.5b).
    #[arg(long = "draft-model")]
    pub draft_model: Option<String>,
    /// Most draft tokens per step (default 5 with --draft-model, 15 with --lookup). Each step
    /// drafts and verifies the number within 0..=K that gives the most tokens per second at the
    /// acceptance rate (for lookup: by how long the copied run is) and the pass costs measured
    /// so far (0 = a plain step where speculation would be slower).
    #[arg(long = "draft-tokens")]
    pub draft_tokens: Option<usize>,
    /// Draft and verify up to --draft-tokens every step instead of adapting (with sampling,
    /// this makes a seeded run reproducible: adaptive lengths depend on measured timings).
    #[arg(long = "fixed-draft-length")]
    pub fixed_draft_length: bool,
    /// With --draft-model: stop drafting where the draft model's top token is less likely than
    /// this, from 0 (draft the full length) to 1. Default 0.6.
    #[arg(long = "draft-min-p")]
    pub draft_min_p: Option<f32>,
    /// With --draft-model: the draft model predicts only the first N token ids (0 = all), a
    /// shortlist of the common pieces that shrinks its output head, the largest mat-mul of a
    /// small model. Default: 65536 for byte-level BPE vocabularies (their ids follow merge
    /// order), all for others.
    #[arg(long = "draft-vocab")]
    pub draft_vocab: Option<usize>,
    /// Speculative decoding by prompt lookup: drafts copied from the prompt and output (no model).
    /// With --draft-model, both: lookup where the output copies, the draft model elsewhere
    /// (--draft-tokens then bounds the draft model's proposals).
    #[arg(long)]
    pub lookup: bool,
}

impl SpeculativeArgs {
    /// Flags that would be ignored are errors: a user who set them expects an effect.
    pub fn check(&self) -> Result<()> {
        if self.draft_model.is_none() {
            for (set, flag) in
                [(self.draft_vocab.is_some(), "--draft-vocab"), (self.draft_min_p.is_some(), "--draft-min-p")]
            {
                if set {
                    bail!("{flag} sets up the draft model: add --draft-model MODEL, or drop {flag}");
                }
            }
            if !self.lookup {
                for (set, flag) in
                    [(self.draft_tokens.is_some(), "--draft-tokens"), (self.fixed_draft_length, "--fixed-draft-length")]
                {
                    if set {
                        bail!("{flag} applies to speculative decoding: add --draft-model MODEL or --lookup, or drop {flag}");
                    }
                }
            }
        }
        if let Some(p) = self.draft_min_p.filter(|p| !(0.0..=1.0).contains(p)) {
            bail!("--draft-min-p {p} is not a probability: use a value from 0 to 1");
        }
        Ok(())
    }

    /// The draft length bounds: --draft-tokens, else the drafter's default.
    pub fn options(&self) -> SpeculativeOptions {
        let lookup_only = self.lookup && self.draft_model.is_none();
        let defaults = if lookup_only { SpeculativeOptions::lookup() } else { SpeculativeOptions::default() };
        SpeculativeOptions {
            max_draft_tokens: self.draft_tokens.unwrap_or(defaults.max_draft_tokens).max(1),
            adaptive: !self.fixed_draft_length,
        }
    }

    /// The prompt lookup bounds of a scheduler drafting for every request (`hearth serve`), or
    /// `None` without `--lookup`. With `--draft-model` too, `--draft-tokens` bounds the draft
    /// model's proposals and lookup keeps its own default length.
    pub fn lookup_options(&self) -> Option<SpeculativeOptions> {
        let lookup = SpeculativeOptions { adaptive: !self.fixed_draft_length, ..SpeculativeOptions::lookup() };
        match (self.lookup, &self.draft_model) {
            (false, _) => None,
            (true, None) => Some(self.options()),
            (true, Some(_)) => Some(lookup),
        }
    }

    /// Sets `engine` up for the drafting asked for (loading `--draft-model` on the target's
    /// backend settings) and returns how its requests draft: prompt lookup, the draft model,
    /// both (lookup first), or not at all.
    /// Its policies start from the pass costs kept for these models and settings (measured
    /// the first time, see [`crate::pass_costs`]).
    pub fn set_up(&self, target: &ModelArgs, engine: &mut Engine) -> Result<Drafting> {
        let options = self.options();
        let drafting = match self.batched_draft_model(target, engine.tokenizer(), 1)? {
            None if self.lookup => Drafting::Lookup { reference: Vec::new(), options },
            None => return Ok(Drafting::None),
            Some(model) => {
                let min_confidence = model.min_confidence;
                engine.set_draft_model(model, options.clone());
                match self.lookup {
                    true => Drafting::LookupThenDraftModel { options, min_confidence },
                    false => Drafting::DraftModel { options, min_confidence },
                }
            }
        };
        // What the costs depend on: the models, the backend (with its threads) and the KV type.
        let key = format!(
            "{}|{:?}|{}|{:?}|{:?}|{:?}|{}",
            target.model,
            self.draft_model,
            engine.backend().name(),
            target.threads,
            target.kv_type,
            target.numerics,
            target.ctx_size
        );
        crate::pass_costs::start_from_kept(engine.scheduler_mut(), &key, target.quiet)?;
        Ok(drafting)
    }

    /// The draft model for a batching scheduler (a KV pool for `max_sequences` requests), if
    /// `--draft-model` names one; loaded on the calling thread.
    pub fn batched_draft_model(
        &self,
        target: &ModelArgs,
        target_tokenizer: &Tokenizer,
        max_sequences: usize,
    ) -> Result<Option<BatchedDraftModel>> {
        let Some((runner, tokenizer, path)) =
            self.load_draft(target, max_sequences, |file, backend, options, on_progress| {
                Runner::load(file, backend, options, on_progress)
            })?
        else {
            return Ok(None);
        };
        let prefill_chunk = EngineOptions::default().prefill_chunk;
        let mut model = BatchedDraftModel::new(runner, &tokenizer, target_tokenizer, prefill_chunk)
            .with_context(|| format!("{} cannot draft for this model", path.display()))?;
        model.min_confidence = self.min_confidence();
        Ok(Some(model))
    }

    fn min_confidence(&self) -> f32 {
        self.draft_min_p.unwrap_or(hearth_core::speculative::DEFAULT_MIN_CONFIDENCE)
    }

    /// Loads `--draft-model` with `load` on the target's backend settings and context size, with
    /// its head shortlisted as `--draft-vocab` says, a KV pool for `max_sequences` sequences and
    /// a progress bar unless `--quiet`; `None` without `--draft-model`.
    fn load_draft<T>(
        &self,
        target: &ModelArgs,
        max_sequences: usize,
        mut load: impl FnMut(
            &GgufFile,
            Box<dyn Backend>,
            &EngineOptions,
            &mut dyn FnMut(u64, u64),
        ) -> hearth_core::Result<T>,
    ) -> Result<Option<(T, Tokenizer, PathBuf)>> {
        let Some(draft) = &self.draft_model else { return Ok(None) };
        let draft_args = ModelArgs { model: draft.clone(), ..target.clone() };
        let (file, path) = load::open(&draft_args)?;
        let tokenizer = Tokenizer::from_gguf(&file.metadata)
            .with_context(|| format!("reading the tokenizer of {}", path.display()))?;
        let logits_vocab = match self.draft_vocab {
            None => default_draft_vocab(&file.metadata),
            Some(0) => None,
            Some(n) => Some(n),
        };
        let options = EngineOptions { n_ctx: target.ctx_size, logits_vocab, max_sequences, ..EngineOptions::default() };
        let bar = load::progress_bar(&path, target.quiet);
        let loaded = load::load_with(&draft_args, |backend| {
            load(&file, backend, &options, &mut |done, total| {
                bar.set_length(total);
                bar.set_position(done);
            })
        })
        .with_context(|| format!("loading the draft model {}", path.display()))?;
        bar.finish_and_clear();
        Ok(Some((loaded, tokenizer, path)))
    }

    /// The stderr summary of what speculation did in one generation.
    pub fn summary(&self, m: &SpeculativeMetrics) -> String {
        // With both drafters, the lookup's share (the rest is the draft model's); with a draft
        // model, its read of the prompt (in the decode time: it comes after the first token; in a
        // chat, only the tokens it has not read in earlier turns).
        let mut details = if self.lookup && self.draft_model.is_some() {
            format!("; prompt lookup: {} of {} in {} passes", m.free_accepted, m.free_proposed, m.free_passes)
        } else {
            String::new()
        };
        if self.draft_model.is_some() {
            details += &format!(
                "; the draft model caught up with the prompt in {:.0} ms, after the first token",
                m.drafter_prepare_ms
            );
        }
        format!(
            "[speculative: {} of {} draft tokens accepted ({:.0}%), {:.2} per step, {} target passes{details}]",
            m.accepted,
            m.proposed,
            m.acceptance_rate * 100.0,
            m.mean_accepted_per_step,
            m.target_forward_passes
        )
    }
}
