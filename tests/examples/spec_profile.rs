//! Where a speculative step's time goes on the CPU backend: the cost of one target forward pass
//! of n = 1..=17 tokens (`LogitsMode::All`, as verification runs it), of one draft-model token,
//! and a breakdown of real speculative runs (drafting vs the rest).
//!
//! `cargo run --release -p hearth-tests --example spec_profile [max_tokens]`
//!
//! `HEARTH_PASS_MAX=N` times passes up to N tokens; `HEARTH_PASSES_ONLY=1` stops after them.
//!
//! `HEARTH_REPLAY_DIR=scripts/speculative-prompts HEARTH_SIMULATE=<ms of passes of 1, 2, … rows>` replays prompt
//! lookup under the policy on every prompt there, without timing anything; with `HEARTH_ORACLE=1` also
//! the least time any choice of verified lengths could take with the same proposals, and fixed
//! caps on the verified length; with `HEARTH_DUMP_DIR=<dir>` also each prompt's tokens and greedy output
//! there (`<prompt>.txt`: two lines of token ids), for offline analysis; with `HEARTH_WARM=1` each prompt
//! starts from the policy the previous one ended with, as in `hearth serve` and `hearth chat`.

use hearth_core::chat::ChatMessage;
use hearth_core::engine::{Engine, EngineOptions, GenerateOptions, Session};
use hearth_core::gguf::GgufFile;
use hearth_core::graph::LogitsMode;
use hearth_core::sampling::SamplingParams;
use hearth_core::scheduler::Drafting;
use hearth_core::speculative::{
    BatchedDraftModel, DraftPolicy, PromptLookup, Proposal, SpeculativeOptions, VerificationOutcome,
};
use hearth_core::tokenizer::Tokenizer;
use hearth_tests::*;
use std::time::Instant;

const CODE_EDIT: &str = "Rewrite this function with type hints:\n\
def merge_counts(first, second):\n    result = dict(first)\n    for key, value in second.items():\n        \
result[key] = result.get(key, 0) + value\n    return result\n";
const PROSE: &str = "Write a short paragraph about why lighthouses were important for sailors.";

fn engine(stem: &str) -> Engine {
    let file = GgufFile::open(&model_path(stem)).expect("open");
    let backend = hearth_cpu::CpuBackend::with_options(hearth_cpu::CpuOptions {
        threads: Some(2),
        ..hearth_cpu::CpuOptions::from_env()
    })
    .expect("cpu backend");
    let options = EngineOptions { n_ctx: 1024, ..EngineOptions::default() };
    Engine::load(&file, Box::new(backend), &options, &mut |_, _| {}).expect("load")
}

fn chat_prompt(engine: &Engine, user: &str) -> Vec<u32> {
    // HEARTH_SYSTEM: a system message before the user's.
    let system = std::env::var("HEARTH_SYSTEM").ok().map(|s| ChatMessage { role: "system".into(), content: s });
    let user = ChatMessage { role: "user".into(), content: user.into() };
    let messages: Vec<ChatMessage> = system.into_iter().chain([user]).collect();
    let text = engine.chat_template().expect("template").render(&messages, true).expect("render");
    engine.tokenizer().encode(&text, false, true).expect("encode")
}

fn pass_costs(session: &mut Session, prompt: &[u32], label: &str, max_n: usize) {
    session.reset();
    session.eval(prompt, LogitsMode::Last).expect("prefill");
    let base = session.history().len();
    let filler: Vec<u32> = prompt.iter().rev().take(max_n).copied().collect();
    eprint!("{label} pass ms by n:");
    for n in 1..=max_n {
        let mut best = f64::MAX;
        let mut first = 0.0;
        for i in 0..3 {
            let t = Instant::now();
            session.eval(&filler[..n], LogitsMode::All).expect("eval");
            let ms = t.elapsed().as_secs_f64() * 1e3;
            if i == 0 {
                first = ms; // includes compiling the graph for this width
            }
            best = best.min(ms);
            session.rollback(base).expect("rollback");
        }
        eprint!(" {n}:{best:.1}(first {first:.0})");
    }
    eprintln!();
}

fn main() {
    let max_tokens: usize = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(64);
    let mut target = engine(QWEN_15B);
    // HEARTH_PROMPT_FILE: a user message of your own instead of the code edit.
    let user = std::env::var("HEARTH_PROMPT_FILE")
        .map(|f| std::fs::read_to_string(f).expect("HEARTH_PROMPT_FILE"))
        .unwrap_or_else(|_| CODE_EDIT.to_string());
    let prompt = chat_prompt(&target, &user);
    let draft_file = hearth_core::gguf::GgufFile::open(&model_path(QWEN_05B)).expect("open draft");
    // HEARTH_DRAFT_VOCAB: the draft model's shortlist (`hearth run --draft-vocab`; 0 = whole vocabulary).
    let draft_vocab = std::env::var("HEARTH_DRAFT_VOCAB").ok().and_then(|v| v.parse().ok()).filter(|&v: &usize| v > 0);
    let draft_options = EngineOptions { n_ctx: 1024, logits_vocab: draft_vocab, ..EngineOptions::default() };
    let mut draft_session = hearth_core::engine::Session::load(
        &draft_file,
        Box::new(
            hearth_cpu::CpuBackend::with_options(hearth_cpu::CpuOptions {
                threads: Some(2),
                ..hearth_cpu::CpuOptions::from_env()
            })
            .expect("cpu"),
        ),
        &draft_options,
        &mut |_, _| {},
    )
    .expect("load draft");
    let draft_tok = Tokenizer::from_gguf(&draft_file.metadata).expect("tok");
    if std::env::var("HEARTH_SKIP_PASSES").is_err() {
        let widest = std::env::var("HEARTH_PASS_MAX").ok().and_then(|v| v.parse().ok()).unwrap_or(17);
        let (runner, tokenizer, template) = target.into_parts();
        let mut session = Session::from_runner(runner, 256);
        pass_costs(&mut session, &prompt, "1.5B", widest);
        target = Engine::from_parts(session.into_runner(), tokenizer, template, &EngineOptions::default());
        if std::env::var("HEARTH_PASSES_ONLY").is_ok() {
            return;
        }
        // The drafter alone: one token at a time (Last).
        let s = &mut draft_session;
        s.reset();
        s.eval(&prompt, LogitsMode::Last).expect("prefill");
        let base = s.history().len();
        let mut best = f64::MAX;
        for _ in 0..5 {
            let t = Instant::now();
            s.eval(&prompt[..1], LogitsMode::Last).expect("eval");
            best = best.min(t.elapsed().as_secs_f64() * 1e3);
            s.rollback(base).expect("rollback");
        }
        eprintln!("0.5B one token (Last): {best:.1} ms");
    }
    let draft =
        BatchedDraftModel::new(draft_session.into_runner(), &draft_tok, target.tokenizer(), 256).expect("draft");
    target.set_draft_model(draft, SpeculativeOptions::default());
    let options0 = GenerateOptions {
        max_tokens,
        sampling: SamplingParams::default(),
        stop: Vec::new(),
        ignore_eos: true,
        ..GenerateOptions::default()
    };
    if let (Ok(dir), Ok(costs)) = (std::env::var("HEARTH_REPLAY_DIR"), std::env::var("HEARTH_SIMULATE")) {
        let costs: Vec<f64> = costs.split(',').map(|c| c.parse().expect("cost")).collect();
        replay_dir(&mut target, &dir, max_tokens, &costs);
        return;
    }
    if let Ok(costs) = std::env::var("HEARTH_SIMULATE") {
        // Pass costs (ms) for widths 1..: replay prompt lookup offline against the greedy output.
        let costs: Vec<f64> = costs.split(',').map(|c| c.parse().expect("cost")).collect();
        for user in [user.as_str(), PROSE] {
            let prompt = chat_prompt(&target, user);
            target.clear_prefix_cache();
            let plain = target.generate_with(&prompt, &options0, Drafting::None, &mut |_| true).expect("generate");
            eprintln!("{:?}", &user[..20]);
            for cap in [1usize, 3, 7, 15] {
                let (passes, proposed, accepted, ms) =
                    simulate(&PromptLookup::default(), &prompt, &plain.tokens, cap, &costs);
                eprintln!(
                    "lookup verified up to {cap}: {passes} passes, {accepted}/{proposed}, {ms:.0} ms vs plain {:.0}",
                    (plain.tokens.len() - 1) as f64 * costs[0]
                );
            }
            // The default lookup under the default cost-driven policy, its observed pass costs
            // disturbed by a multiplicative noise of up to ±NOISE (a shared machine).
            for noise in [0.0, 0.2, 0.5] {
                let mut policy = DraftPolicy::new(&SpeculativeOptions { max_draft_tokens: 15, adaptive: true });
                let (passes, proposed, accepted, ms) =
                    simulate_policy(&PromptLookup::default(), &prompt, &plain.tokens, &mut policy, &costs, noise);
                eprintln!(
                    "policy (noise {noise}): {passes} passes, {accepted}/{proposed}, {ms:.0} ms vs plain {:.0}",
                    (plain.tokens.len() - 1) as f64 * costs[0]
                );
            }
        }
        return;
    }
    let options = GenerateOptions {
        max_tokens,
        sampling: SamplingParams::default(),
        stop: Vec::new(),
        ignore_eos: true,
        ..GenerateOptions::default()
    };
    target.clear_prefix_cache();
    let plain = target.generate_with(&prompt, &options, Drafting::None, &mut |_| true).expect("generate");
    eprintln!("plain: {:.1} tok/s decode ({} tokens)", plain.timings.decode_tok_s, plain.tokens.len());
    // (label, max draft tokens, adaptive, draft min confidence)
    let mut runs: Vec<(String, usize, bool, f32)> = vec![("lookup".into(), 15, true, 0.0)];
    let configs = std::env::var("HEARTH_DRAFT_CONFIGS").unwrap_or_else(|_| "5:0,5:0.6,3:0.6,7:0.6".into());
    // K:CONF a draft model, LK:CONF prompt lookup first and the draft model where nothing matches.
    for c in configs.split(',').filter(|c| !c.is_empty()) {
        let (k, conf) = c.split_once(':').expect("K:CONF");
        let (prefix, k) = if let Some(k) = k.strip_prefix('L') { ("lookup+draft", k) } else { ("draft", k) };
        runs.push((format!("{prefix} k {k} conf {conf}"), k.parse().expect("k"), true, conf.parse().expect("conf")));
    }
    for (label, k, adaptive, conf) in runs {
        target.clear_prefix_cache();
        let options = SpeculativeOptions { max_draft_tokens: k, adaptive };
        let drafting = if label == "lookup" {
            Drafting::Lookup { reference: Vec::new(), options }
        } else if label.starts_with("lookup+draft") {
            Drafting::LookupThenDraftModel { options, min_confidence: conf }
        } else {
            Drafting::DraftModel { options, min_confidence: conf }
        };
        let t = Instant::now();
        let g = target.generate_with(&prompt, &options0, drafting, &mut |_| true).expect("spec");
        let total = t.elapsed().as_secs_f64() * 1e3;
        let m = g.speculative.expect("metrics");
        assert_eq!(g.tokens, plain.tokens, "{label}: output differs from plain greedy");
        eprintln!(
            "{label}: {:.1} tok/s decode; total {total:.0} ms (prompt {:.0}, draft reading it {:.0}); {} passes, {}/{} accepted ({:.2}/pass); free {} passes {}/{}",
            g.timings.decode_tok_s,
            g.timings.prompt_ms,
            m.drafter_prepare_ms,
            m.target_forward_passes,
            m.accepted,
            m.proposed,
            m.mean_accepted_per_step,
            m.free_passes,
            m.free_accepted,
            m.free_proposed
        );
    }
    eprintln!("text: {:?}", plain.text);
}

/// The default lookup under the default policy replayed on every prompt of `dir` (to the end of
/// the answer, at most `max_tokens`) against the pass costs `costs`: the speedup over plain
/// decoding per prompt and over the `code-*` prompts together.
fn replay_dir(target: &mut Engine, dir: &str, max_tokens: usize, costs: &[f64]) {
    let options = GenerateOptions {
        max_tokens,
        sampling: SamplingParams::default(),
        stop: Vec::new(),
        ignore_eos: false,
        ..GenerateOptions::default()
    };
    let mut paths: Vec<_> = std::fs::read_dir(dir).expect("dir").map(|e| e.expect("entry").path()).collect();
    paths.sort();
    let (mut plain_total, mut lookup_total, mut oracle_total) = (0.0, 0.0, 0.0);
    let mut carried: Option<DraftPolicy> = None;
    for path in paths {
        let prompt = chat_prompt(target, &std::fs::read_to_string(&path).expect("prompt"));
        target.clear_prefix_cache();
        let plain = target.generate_with(&prompt, &options, Drafting::None, &mut |_| true).expect("generate");
        let plain_ms = (plain.tokens.len() - 1) as f64 * costs[0];
        if let Ok(dump) = std::env::var("HEARTH_DUMP_DIR") {
            let name = path.file_stem().unwrap_or_default().to_string_lossy().to_string();
            let text = format!("{:?}\n{:?}\n", prompt, plain.tokens);
            std::fs::write(format!("{dump}/{name}.txt"), text).expect("dump");
        }
        // HEARTH_WARM=1: each prompt starts from the policy the last one ended with (hearth serve, chat).
        let mut policy = match (&carried, std::env::var("HEARTH_WARM").is_ok()) {
            (Some(last), true) => last.for_next_request(),
            _ => DraftPolicy::new(&SpeculativeOptions { max_draft_tokens: 15, adaptive: true }),
        };
        let (passes, proposed, accepted, ms) =
            simulate_policy(&PromptLookup::default(), &prompt, &plain.tokens, &mut policy, costs, 0.0);
        carried = Some(policy);
        let name = path.file_stem().unwrap_or_default().to_string_lossy().to_string();
        let code = name.starts_with("code");
        if code {
            plain_total += plain_ms;
            lookup_total += ms;
        }
        eprintln!(
            "{name}: {} tokens, {passes} passes, {accepted}/{proposed} accepted, {:.2}x",
            plain.tokens.len(),
            plain_ms / ms
        );
        if std::env::var("HEARTH_ORACLE").is_ok() {
            let oracle = oracle_ms(&PromptLookup::default(), &prompt, &plain.tokens, 15, costs);
            let caps: Vec<String> = [1usize, 2, 3, 4, 5, 7, 15]
                .iter()
                .map(|&cap| {
                    let (_, _, _, ms) = simulate(&PromptLookup::default(), &prompt, &plain.tokens, cap, costs);
                    format!("cap {cap}: {:.2}x", plain_ms / ms)
                })
                .collect();
            eprintln!("    oracle {:.2}x; {}", plain_ms / oracle, caps.join(", "));
            if code {
                oracle_total += oracle;
            }
        }
    }
    eprintln!("code prompts together: {:.2}x", plain_total / lookup_total);
    if oracle_total > 0.0 {
        eprintln!("code prompts together, the best verified lengths: {:.2}x", plain_total / oracle_total);
    }
}

/// The least time any choice of verified lengths could take with the lookup's proposals (each
/// step verifies some prefix of the proposal; dynamic programming from the end).
fn oracle_ms(lookup: &PromptLookup, prompt: &[u32], output: &[u32], k: usize, costs: &[f64]) -> f64 {
    let n = output.len();
    let mut best = vec![0.0f64; n + 1];
    for pos in (1..n).rev() {
        let context: Vec<u32> = prompt.iter().chain(&output[..pos]).copied().collect();
        let draft = lookup.proposal(&context, k.min(n - pos - 1)).tokens;
        let ok = draft.iter().zip(&output[pos..]).take_while(|(a, b)| a == b).count();
        best[pos] = (0..=draft.len())
            .map(|v| costs[v.min(costs.len() - 1)] + best[(pos + v.min(ok) + 1).min(n)])
            .fold(f64::MAX, f64::min);
    }
    best[1]
}

/// Greedy verification replayed with up to `k` drafts verified per pass: each pass accepts the
/// drafts that equal the real output.
fn simulate(
    lookup: &PromptLookup,
    prompt: &[u32],
    output: &[u32],
    k: usize,
    costs: &[f64],
) -> (usize, usize, usize, f64) {
    let mut pos = 1; // the first token comes from the prompt pass
    let (mut passes, mut proposed, mut accepted, mut ms) = (0, 0, 0, 0.0);
    while pos < output.len() {
        let context: Vec<u32> = prompt.iter().chain(&output[..pos]).copied().collect();
        let budget = k.min(output.len() - pos - 1);
        let draft = lookup.proposal(&context, budget).tokens;
        let ok = draft.iter().zip(&output[pos..]).take_while(|(a, b)| a == b).count();
        passes += 1;
        proposed += draft.len();
        accepted += ok;
        ms += costs[draft.len().min(costs.len() - 1)];
        pos += ok + 1;
    }
    (passes, proposed, accepted, ms)
}

/// `simulate` with [`DraftPolicy`] choosing how much of each lookup proposal to verify, fed the
/// pass costs of `costs` (index: width - 1) times a pseudo-random factor in 1 ± `noise`.
fn simulate_policy(
    lookup: &PromptLookup,
    prompt: &[u32],
    output: &[u32],
    policy: &mut DraftPolicy,
    costs: &[f64],
    noise: f64,
) -> (usize, usize, usize, f64) {
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    let mut jitter = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        1.0 + noise * (2.0 * ((state >> 11) as f64 / (1u64 << 53) as f64) - 1.0)
    };
    let mut pos = 1;
    let (mut passes, mut proposed, mut accepted, mut ms) = (0, 0, 0, 0.0);
    while pos < output.len() {
        let context: Vec<u32> = prompt.iter().chain(&output[..pos]).copied().collect();
        let budget = policy.request().min(output.len() - pos - 1);
        let proposal = if budget > 0 { lookup.proposal(&context, budget) } else { Proposal::default() };
        let (draft, matched) = (&proposal.tokens, proposal.matched);
        policy.observe_draft(budget, 0.0);
        let verify = policy.verify_length(draft.len(), matched);
        let ok = draft[..verify].iter().zip(&output[pos..]).take_while(|(a, b)| a == b).count();
        let cost = costs[verify.min(costs.len() - 1)];
        policy.observe_pass(1 + verify, cost * jitter());
        let Some(&next) = output.get(pos + ok) else { break };
        let outcome = VerificationOutcome { accepted: ok, proposed: verify, continuation_token: next };
        policy.observe_step(&outcome, &draft[..verify], &draft[verify..], matched, budget);
        if std::env::var("HEARTH_VERBOSE").is_ok() {
            let would = draft.iter().zip(&output[pos..]).take_while(|(a, b)| a == b).count();
            eprintln!(
                "  pos {pos} matched {matched:?} proposed {} verified {verify} kept {ok} (would keep {would})",
                draft.len()
            );
        }
        passes += 1;
        proposed += verify;
        accepted += ok;
        ms += cost;
        pos += ok + 1;
    }
    (passes, proposed, accepted, ms)
}
