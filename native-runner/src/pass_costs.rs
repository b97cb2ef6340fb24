//! The pass costs a speculating scheduler starts its draft policies from
//! ([`hearth_core::scheduler::PassCosts`]), kept between runs of `hearth run` and `hearth chat`
//! in `cache_dir()/pass-costs/`: measured the first time a model speculates with these models
//! and settings, read back after. A one-shot run cannot afford the second or two the
//! measurement takes, and its short answer is where a policy needs them most; `hearth serve`
//! measures at load. Stale costs (another load on the machine) are only a start: the policy
//! keeps measuring the passes it runs.

use crate::fetch::cache_dir;
use anyhow::{Context, Result};
use hearth_core::scheduler::{PassCosts, Scheduler};
use sha2::{Digest, Sha256};
use std::path::PathBuf;

/// Starts `scheduler`'s policies from the costs kept under `key` (what the costs depend on:
/// models, backend, threads, KV type), measuring and keeping them when there are none.
/// `HEARTH_PASS_COSTS=off` leaves the policies to learn the costs from their own passes (the
/// A/B of docs/BENCHMARKS.md).
pub fn start_from_kept(scheduler: &mut Scheduler, key: &str, quiet: bool) -> Result<()> {
    if std::env::var("HEARTH_PASS_COSTS").is_ok_and(|v| v == "off") {
        return Ok(());
    }
    let path = path_for(key);
    let kept = std::fs::read(&path).ok().and_then(|bytes| serde_json::from_slice::<PassCosts>(&bytes).ok());
    if let Some(costs) = kept {
        scheduler.set_pass_costs(costs);
        return Ok(());
    }
    let costs = measure(scheduler, quiet)?;
    // Keeping them is an optimisation: a read-only cache only means measuring next time.
    let _ = std::fs::create_dir_all(path.parent().unwrap_or(&path))
        .and_then(|_| std::fs::write(&path, serde_json::to_vec(&costs).unwrap_or_default()));
    Ok(())
}

/// Measures `scheduler`'s pass costs now, saying so on stderr unless `quiet`.
pub fn measure(scheduler: &mut Scheduler, quiet: bool) -> Result<PassCosts> {
    let costs = scheduler.measure_pass_costs().context("measuring the pass costs for speculative decoding")?;
    if !quiet {
        eprintln!("{}", describe(&costs));
    }
    Ok(costs)
}

fn describe(costs: &PassCosts) -> String {
    let passes: Vec<String> = costs.target.iter().map(|(rows, ms)| format!("{rows}: {ms:.1}")).collect();
    let draft = costs.draft.map(|ms| format!("; a draft model pass {ms:.1} ms")).unwrap_or_default();
    format!("speculative decoding: verification pass ms by rows {}{draft}", passes.join(", "))
}

fn path_for(key: &str) -> PathBuf {
    let digest = Sha256::digest(key.as_bytes());
    let name: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
    cache_dir().join("pass-costs").join(format!("{name}.json"))
}
