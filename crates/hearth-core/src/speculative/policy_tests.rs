use super::*;
use crate::speculative::SpeculativeOptions;

/// Pass costs of Qwen2.5-Coder-1.5B on 2 CPU cores (tests/examples/spec_profile.rs, ms by width).
fn cpu_pass_ms(width: usize) -> f64 {
    [39.0, 82.0, 101.0, 87.0, 109.0, 135.0, 163.0, 152.0, 173.0, 200.0, 227.0, 220.0, 238.0, 265.0, 292.0, 286.0]
        .get(width - 1)
        .copied()
        .unwrap_or(20.0 * width as f64)
}

/// A GPU: the weights are read once per pass, rows are nearly free.
fn gpu_pass_ms(width: usize) -> f64 {
    6.0 + 0.05 * width as f64
}

fn policy(max: usize) -> DraftPolicy {
    DraftPolicy::new(&SpeculativeOptions { max_draft_tokens: max, adaptive: true })
}

/// Runs `steps` steps of a drafter whose tokens are each kept with probability `p` given the
/// previous (coins from a fixed xorshift sequence, so every run is the same), with the given
/// costs; returns the number of drafts verified at each step.
fn simulate(
    policy: &mut DraftPolicy,
    steps: usize,
    p: f64,
    pass_ms: impl Fn(usize) -> f64,
    draft_ms_per_token: f64,
) -> Vec<usize> {
    let mut coin = coins();
    let mut chosen = Vec::new();
    for _ in 0..steps {
        let requested = policy.request();
        if requested > 0 {
            policy.observe_draft(requested, draft_ms_per_token * requested as f64);
        }
        let verified = policy.verify_length(requested, None);
        // How far this proposal's drafts (all token 1) would be kept: each with probability p
        // after the last; the target's token after them is 2.
        let reach = (0..requested).take_while(|_| coin() < p).count();
        policy.observe_pass(1 + verified, pass_ms(1 + verified));
        let accepted = reach.min(verified);
        policy.observe_outcome(requested, None, verified, accepted);
        if accepted == verified {
            policy.track_unverified(requested, None, verified, &vec![1; requested - verified]);
        }
        policy.observe_token(if reach > verified { 1 } else { 2 });
        chosen.push(verified);
    }
    chosen
}

/// Uniform draws in [0, 1) from a fixed xorshift sequence, so that every run is the same.
fn coins() -> impl FnMut() -> f64 {
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 11) as f64 / (1u64 << 53) as f64
    }
}

fn mean(xs: &[usize]) -> f64 {
    xs.iter().sum::<usize>() as f64 / xs.len().max(1) as f64
}

#[test]
fn expected_tokens_follow_the_geometric_model() {
    assert_eq!(DraftPolicy::expected_tokens(0.5, 0), 1.0);
    assert!((DraftPolicy::expected_tokens(0.5, 3) - 1.875).abs() < 1e-12);
    assert!((DraftPolicy::expected_tokens(1.0, 7) - 8.0).abs() < 1e-12);
}

#[test]
fn the_first_step_drafts_in_full_and_the_second_measures_a_plain_pass() {
    let mut p = policy(5);
    assert_eq!(p.request(), 5);
    assert_eq!(p.verify_length(5, None), 5);
    p.observe_draft(5, 100.0);
    p.observe_pass(6, 135.0);
    p.observe_outcome(5, None, 5, 2);
    // A drafter that costs time is not asked while the plain pass is measured.
    assert_eq!(p.request(), 0);
    assert_eq!(p.verify_length(0, None), 0);
}

#[test]
fn in_a_batch_the_costs_decide_once_the_batchs_own_plain_pass_is_measured() {
    // Three requests always decode together: no pass of one row is ever run.
    let mut p = policy(8);
    p.request();
    p.observe_pass(3 + 8, 60.0);
    p.request();
    assert_eq!(p.forced_length(8, 3), Some(0), "the plain pass of 3 rows is not measured yet");
    p.observe_pass(3, 30.0);
    assert_eq!(p.forced_length(8, 3), None, "the batch's plain pass is measured: the costs decide");
    assert_eq!(p.forced_length(8, 1), Some(0), "alone, it would still measure a one-row pass");
}

#[test]
fn the_next_request_starts_from_what_the_last_one_measured() {
    // A CPU request that learnt its drafts rarely pay.
    let mut first = policy(15);
    simulate(&mut first, 100, 0.3, cpu_pass_ms, 0.0);
    first.track_unverified(3, Some(1), 0, &[7, 8, 9]);
    let next = first.for_next_request();
    // No full-width first step and no plain pass to measure again: the next request decides
    // from the pass costs and acceptance it inherits.
    let mut fresh = policy(15);
    assert_eq!(fresh.request(), 15);
    assert_eq!(fresh.verify_length(15, None), 15, "a fresh policy tries its first proposal whole");
    assert_eq!(next.verify_length(15, None), 0, "drafts kept 30% of the time do not pay on 2 cores");
    assert!((next.acceptance() - first.acceptance()).abs() < 1e-12);
    // The copies the last request was scoring belong to its text.
    assert!(first.copies.len() == 1 && next.copies.is_empty());
}

#[test]
fn a_cpu_with_rarely_kept_drafts_decodes_plainly_except_for_probes() {
    // Prose with prompt lookup on 2 cores: ~30% of drafts kept, a 4-row pass costs 2.2 plain ones.
    let mut p = policy(15);
    let chosen = simulate(&mut p, 200, 0.3, cpu_pass_ms, 0.0);
    let speculative_steps = chosen[10..].iter().filter(|&&k| k > 0).count();
    assert!(speculative_steps <= 10, "verified drafts in {speculative_steps} of 190 steps: {chosen:?}");
    assert!(p.acceptance() < 0.45, "{}", p.acceptance());
}

#[test]
fn a_cpu_with_mostly_kept_drafts_speculates() {
    let mut p = policy(15);
    let chosen = simulate(&mut p, 200, 0.9, cpu_pass_ms, 0.0);
    assert!(mean(&chosen[10..]) >= 3.0, "{chosen:?}");
}

#[test]
fn a_gpu_speculates_even_when_few_drafts_are_kept() {
    // Verifying 8 rows costs 3% more than one: even a 30% acceptance gains.
    let mut p = policy(7);
    let chosen = simulate(&mut p, 200, 0.3, gpu_pass_ms, 0.0);
    assert!(mean(&chosen[10..]) >= 1.0, "{chosen:?}");
    assert!(chosen[10..].iter().all(|&k| k > 0), "{chosen:?}");
}

#[test]
fn an_expensive_drafter_is_dropped_where_it_cannot_pay_and_probed_again() {
    // A draft model costing 0.58 target passes per token (0.5B for 1.5B on a CPU), 89% kept.
    let mut p = policy(5);
    let chosen = simulate(&mut p, 100, 0.89, cpu_pass_ms, 22.5);
    assert!(!p.drafting_is_free());
    // After a few steps that measure the unknown widths, only the periodic probes draft.
    let drafting_steps: Vec<usize> = (20..100).filter(|&i| chosen[i] > 0).collect();
    assert!(!drafting_steps.is_empty(), "never probed again: {chosen:?}");
    assert!(
        drafting_steps.len() <= 80 / PROBE_EVERY + 1,
        "drafted in {} of 80 steps: {chosen:?}",
        drafting_steps.len()
    );
}

#[test]
fn a_cheap_drafter_with_kept_drafts_is_used() {
    // The same acceptance from a drafter that costs 5% of a plain pass per token.
    let mut p = policy(5);
    let chosen = simulate(&mut p, 100, 0.89, gpu_pass_ms, 0.3);
    assert!(mean(&chosen[10..]) >= 3.0, "{chosen:?}");
}

#[test]
fn a_free_drafter_is_asked_every_step_and_scored_while_unverified() {
    // Drafts are kept 30% of the time, then the output starts copying (95%): the unverified
    // proposals, scored against the target's tokens, bring speculation back without probes.
    let mut p = policy(15);
    let plain = simulate(&mut p, 60, 0.3, cpu_pass_ms, 0.0);
    assert!(p.drafting_is_free());
    assert!(plain[10..].iter().filter(|&&k| k > 0).count() <= 5, "{plain:?}");
    let copying = simulate(&mut p, 40, 0.95, cpu_pass_ms, 0.0);
    let resumed = copying.iter().position(|&k| k > 0).expect("speculation resumed");
    assert!(resumed <= 8, "resumed after {resumed} steps: {copying:?}");
}

#[test]
fn long_proposals_are_trusted_by_their_own_record() {
    // Proposals of 11 tokens (long matches) are all kept, proposals of 3 always rejected: the
    // long ones are verified whole, although the overall rate alone would not pay for them.
    let mut p = policy(15);
    for w in 1..=16 {
        p.observe_pass(w, cpu_pass_ms(w));
    }
    for _ in 0..20 {
        p.observe_outcome(3, None, 3, 0);
        p.observe_outcome(11, None, 11, 11);
    }
    p.steps = 5;
    assert_eq!(p.verify_length(11, None), 11);
    assert_eq!(p.verify_length(3, None), 0);
}

#[test]
fn a_fixed_length_ignores_costs() {
    let mut p = DraftPolicy::new(&SpeculativeOptions { max_draft_tokens: 4, adaptive: false });
    let chosen = simulate(&mut p, 30, 0.0, cpu_pass_ms, 50.0);
    assert!(chosen.iter().all(|&k| k == 4), "{chosen:?}");
}

#[test]
fn unmeasured_widths_are_estimated_from_measured_neighbours() {
    let mut costs = PassCosts::new();
    assert_eq!(costs.estimate(5), 1.0, "nothing known: all widths equal");
    costs.observe(4, 80.0);
    assert_eq!(costs.estimate(8), 80.0, "one width known: wider ones as cheap (to be tried)");
    assert_eq!(costs.estimate(1), 80.0, "...and narrower ones too");
    costs.observe(1, 40.0);
    assert!((costs.estimate(2) - 160.0 / 3.0).abs() < 1e-9, "between 1 and 4: {}", costs.estimate(2));
    assert!((costs.estimate(7) - 120.0).abs() < 1e-9, "beyond 4 with the slope from 1 to 4: {}", costs.estimate(7));
    costs.observe(8, 80.0);
    assert!(
        (costs.estimate(12) - 80.0 - 4.0 * 40.0 / 7.0).abs() < 1e-9,
        "beyond 8 with the mean slope from 1 to 8: {}",
        costs.estimate(12)
    );
    let mut falling = PassCosts::new();
    falling.observe(1, 40.0);
    falling.observe(8, 35.0);
    assert_eq!(falling.estimate(12), 35.0, "a falling slope is not extrapolated");
    for _ in 0..60 {
        costs.observe(8, 100.0);
    }
    assert!((costs.measured(8).unwrap() - 100.0).abs() < 1e-3, "a width's cost follows its newest measurements");
}

#[test]
fn unverified_drafts_are_scored_until_the_first_mismatch() {
    let mut p = policy(8);
    let before = p.acceptance();
    p.track_unverified(4, None, 0, &[7, 8, 9, 10]);
    p.observe_token(7);
    p.observe_token(8);
    let after_two = p.acceptance();
    assert!(after_two > before, "{before} -> {after_two}");
    p.observe_token(5);
    let after_miss = p.acceptance();
    assert!(after_miss < after_two, "{after_two} -> {after_miss}");
    p.observe_token(10);
    assert_eq!(p.acceptance(), after_miss, "after a mismatch the rest is not scored");
    p.track_unverified(4, None, 0, &[1, 2]);
    p.track_unverified(4, None, 0, &[]);
    p.observe_token(1);
    assert!(p.acceptance() > after_miss, "an empty proposal keeps the tracked drafts");
}

/// Runs `steps` steps of a draft model that proposes at most `proposes` tokens whatever the
/// request (it stops where it is unsure), each kept with probability `p`; its first pass costs
/// `first_ms`, each further one `next_ms`. Returns the number of drafts verified at each step.
fn simulate_stopping(
    policy: &mut DraftPolicy,
    steps: usize,
    proposes: usize,
    p: f64,
    (first_ms, next_ms): (f64, f64),
    pass_ms: impl Fn(usize) -> f64,
) -> Vec<usize> {
    let mut coin = coins();
    let mut chosen = Vec::new();
    for _ in 0..steps {
        let requested = policy.request();
        let proposed = requested.min(proposes);
        if requested > 0 {
            let later = proposed.saturating_sub(1);
            policy.observe_draft_timing(&super::super::DraftTiming {
                first_pass_ms: Some(first_ms),
                later_passes: later,
                later_ms: next_ms * later as f64,
            });
        }
        let verified = policy.verify_length(proposed, None);
        let reach = (0..proposed).take_while(|_| coin() < p).count();
        policy.observe_pass(1 + verified, pass_ms(1 + verified));
        let accepted = reach.min(verified);
        policy.observe_outcome(proposed, None, verified, accepted);
        if proposed < requested && accepted == proposed {
            policy.observe_stop();
        }
        chosen.push(verified);
    }
    chosen
}

#[test]
fn a_draft_model_that_stops_short_is_judged_per_request() {
    // 9 in 10 proposed drafts are kept, but the drafter proposes one token however many are
    // asked for; a proposal's first pass costs 30 ms, a row of verification 10 ms over a plain
    // pass of 39. Five full drafts would pay (4.7 tokens for ~140 ms against 39 ms a token); the
    // one draft it proposes does not (1.9 tokens for 79 ms). Judged by the kept share of
    // proposed drafts the policy drafted every step; per requested position, only to probe.
    let mut p = policy(5);
    let pass_ms = |width: usize| 39.0 + 10.0 * (width - 1) as f64;
    let chosen = simulate_stopping(&mut p, 100, 1, 0.9, (30.0, 5.0), pass_ms);
    let drafting_steps = (20..100).filter(|&i| chosen[i] > 0).count();
    assert!(drafting_steps <= 80 / PROBE_EVERY + 1, "drafted in {drafting_steps} of 80 steps: {chosen:?}");
    assert!(p.acceptance() > 0.7, "proposed drafts are still counted as mostly kept: {}", p.acceptance());
    // The same drafter proposing all 5 is used.
    let mut p = policy(5);
    let chosen = simulate_stopping(&mut p, 100, 5, 0.9, (30.0, 5.0), pass_ms);
    assert!(mean(&chosen[20..]) >= 3.0, "{chosen:?}");
}

#[test]
fn a_draft_models_first_pass_is_paid_by_every_proposal() {
    let mut p = policy(5);
    p.observe_draft_timing(&super::super::DraftTiming { first_pass_ms: Some(30.0), later_passes: 4, later_ms: 40.0 });
    assert!((p.draft_ms(1) - 30.0).abs() < 1e-9);
    assert!((p.draft_ms(5) - 70.0).abs() < 1e-9);
    // A first pass that also caught up on a pause is not a cost of drafting.
    p.observe_draft_timing(&super::super::DraftTiming { first_pass_ms: None, later_passes: 2, later_ms: 20.0 });
    assert!((p.draft_ms(1) - 30.0).abs() < 1e-9, "{}", p.draft_ms(1));
    assert!(!p.drafting_is_free());
}

#[test]
fn one_rejected_first_draft_does_not_pause_a_drafter_that_could_pay() {
    // The 0.5B drafting for the 1.5B on 2 CPU cores: 8.5 ms per draft token, a plain pass 24.5 ms,
    // 2 and 3 rows 25 and 30 ms. Its first proposal is one token, rejected.
    let pass_ms = |w: usize| [24.5, 25.0, 29.9, 34.1, 50.2, 54.0].get(w - 1).copied().unwrap_or(60.0);
    let mut p = policy(5);
    assert_eq!(p.request(), 5);
    p.observe_draft(1, 8.5);
    p.observe_pass(2, pass_ms(2));
    p.observe_outcome(1, None, 1, 0);
    p.observe_token(2);
    assert_eq!(p.request(), 0, "the second step measures a plain pass");
    p.observe_pass(1, pass_ms(1));
    // Judged on one position, the estimate (1/2) says pause; the drafter gets a few more tries.
    let k = p.request();
    assert!(k > 0, "paused after one rejected draft");
    p.observe_draft(k, 8.5 * k as f64);
    p.observe_pass(1 + k, pass_ms(1 + k));
    p.observe_outcome(k, None, k, k);
    // Kept: it goes on drafting on its own record.
    assert!(p.request() > 0);
    // A drafter whose tries keep failing is paused once judged.
    let mut q = policy(5);
    q.request();
    q.observe_draft(1, 8.5);
    q.observe_pass(2, pass_ms(2));
    q.observe_outcome(1, None, 1, 0);
    q.request();
    q.observe_pass(1, pass_ms(1));
    for _ in 0..MIN_JUDGED_POSITIONS {
        let k = q.request();
        if k == 0 {
            break;
        }
        q.observe_draft(k, 8.5 * k as f64);
        q.observe_pass(1 + k, pass_ms(1 + k));
        q.observe_outcome(k, None, k, 0);
    }
    assert_eq!(q.request(), 0, "a drafter judged wrong at every try keeps drafting");
}

/// Qwen2.5-Coder-1.5B on 2 CPU cores, ms by width (spec_profile, 2026-11-30).
fn cpu_pass_ms_measured(width: usize) -> f64 {
    [20.3, 22.9, 28.3, 37.0, 47.4, 51.5, 56.4, 58.5, 66.6, 71.0, 75.2, 77.7, 85.1, 87.0, 92.2, 96.9]
        .get(width - 1)
        .copied()
        .unwrap_or(6.0 * width as f64)
}

/// A policy of up to 15 drafts that has measured passes of 1-16 rows at `pass_ms`.
fn measured_policy(pass_ms: fn(usize) -> f64) -> DraftPolicy {
    let mut p = policy(15);
    for w in 1..=16 {
        p.observe_pass(w, pass_ms(w));
    }
    p
}

/// A copy of `length` drafts from a match of `matched` tokens was scored against the target's
/// tokens: its first `kept` drafts were kept, the next one (if any) rejected.
fn copy_seen(p: &mut DraftPolicy, matched: usize, length: usize, kept: usize) {
    p.track_unverified(length, Some(matched), 0, &vec![1; length]);
    (0..kept).for_each(|_| p.observe_token(1));
    p.observe_token(2);
}

#[test]
fn a_copy_is_verified_as_far_as_its_run_says() {
    // One-token matches were wrong, copies that had run 6 tokens went on: a long copied run is
    // verified in full, a one-token guess not at all, whatever the proposal's length.
    let mut p = measured_policy(cpu_pass_ms_measured);
    for _ in 0..30 {
        copy_seen(&mut p, 1, 15, 0);
        copy_seen(&mut p, 6, 15, 15);
    }
    p.steps = 5;
    assert_eq!(p.verify_length(15, Some(8)), 15);
    assert_eq!(p.verify_length(15, Some(1)), 0);
    // Runs 2-5 were never seen: their prior (run + 1) / (run + 2) makes a prefix worth a pass.
    let from_two = p.verify_length(15, Some(2));
    assert!(from_two > 0, "{from_two}");
    // The continuation available bounds the prefix.
    assert_eq!(p.verify_length(3, Some(8)), 3);
}

#[test]
fn a_copy_breaking_at_the_same_run_length_is_verified_up_to_it() {
    // Copies always break after 7 drafts from a 2-token match (a type hint inserted into each
    // copied parameter list): verifying past that costs a wider pass for nothing.
    let mut p = measured_policy(cpu_pass_ms_measured);
    for _ in 0..40 {
        copy_seen(&mut p, 2, 15, 7);
    }
    p.steps = 5;
    assert_eq!(p.verify_length(15, Some(2)), 7);
}

#[test]
fn unverified_copied_drafts_are_scored_by_the_run_they_extend() {
    let mut p = policy(15);
    let before = p.run_acceptances();
    // A copy that matched 3 tokens, 2 drafts verified and kept: the first unverified one
    // extends a run of 5.
    p.track_unverified(10, Some(3), 2, &[7, 8]);
    p.observe_token(7);
    let after_kept = p.run_acceptances();
    assert!(after_kept[4] > before[4], "run 5: {} -> {}", before[4], after_kept[4]);
    p.observe_token(9);
    let after_miss = p.run_acceptances();
    assert!(after_miss[5] < after_kept[5], "run 6: {} -> {}", after_kept[5], after_miss[5]);
    assert_eq!(after_miss[..4], before[..4], "shorter runs than the drafts extended are untouched");
}

#[test]
fn on_a_gpu_a_copy_is_verified_far_even_from_a_one_token_match() {
    // A row costs next to nothing: drafts far down a guessed copy are still worth their rows
    // (until the chance of reaching them is below a row's 1% of a pass).
    let mut p = measured_policy(gpu_pass_ms);
    p.steps = 5;
    let guessed = p.verify_length(15, Some(1));
    assert!(guessed >= 8, "{guessed}");
    // On 2 CPU cores the same guess is verified one draft at most.
    let mut q = measured_policy(cpu_pass_ms_measured);
    q.steps = 5;
    assert!(q.verify_length(15, Some(1)) <= 1, "{}", q.verify_length(15, Some(1)));
}
