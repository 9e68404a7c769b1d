//! `strata search`: which split of a model over a cluster trains fastest and fits? Every
//! candidate is valid or rejected with its reason; memory is screened analytically; the
//! rest are estimated in closed form and the best simulated in full. Prints the top-k with
//! their breakdowns and the counts of rejections; `--out` writes the winner's scenario and
//! plan, a CSV of every candidate, and the launch files of the framework that runs the
//! winner (`training.framework`), through `strata export`'s writers.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use strata_models::accounting::memory;
use strata_models::{Framework, Scenario, plan};
use strata_sim::search::{self, Candidate, Progress, SearchOptions, SearchResult, SearchSpace};

use crate::cmd::search_ties;
use crate::cmd::simulate::SimArgs;
use crate::common::{self, ScenarioArgs};

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub scenario: ScenarioArgs,
    #[command(flatten)]
    pub sim: SimArgs,
    /// Search for this many GPUs (the cluster gets GPUS / gpus_per_node nodes).
    #[arg(long)]
    pub gpus: Option<u64>,
    /// Rows of the result table.
    #[arg(long, default_value_t = 10)]
    pub top: usize,
    /// Candidates to simulate in full (best estimates first); the rest are ranked by estimate only.
    #[arg(long, default_value_t = 64)]
    pub simulate: usize,
    /// Simulate every candidate that passes the memory screen (slow on large spaces).
    #[arg(long)]
    pub exhaustive: bool,
    /// Vary only the split and schedule (tp, pp, micro-batch, schedule, vpp, ZeRO, recomputation,
    /// sequence parallel); keep the bucket size and overlap flags of the scenario.
    #[arg(long)]
    pub splits_only: bool,
    /// Write the winner's scenario, plan, the launch files of the framework that runs it (as
    /// `strata export` writes them) and a CSV of every candidate to this directory.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// The framework the winner must run under: megatron, deepspeed, torchtitan, strata, or
    /// any (the three external ones, each candidate naming its own). Default: the scenario's.
    #[arg(long, value_name = "FRAMEWORK")]
    pub framework: Option<String>,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
}

/// The frameworks `--framework` names.
fn frameworks(arg: Option<&str>, base: &Scenario) -> anyhow::Result<Vec<Framework>> {
    match arg {
        None => Ok(vec![base.training.framework]),
        Some("any") => Ok(Framework::EXTERNAL.to_vec()),
        Some(key) => match Framework::from_key(key) {
            Some(f) => Ok(vec![f]),
            None => anyhow::bail!("--framework {key}: unknown framework; known: {}, \"any\"", Framework::known_keys()),
        },
    }
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let mut base = args.scenario.load_for_search()?;
    let searched = frameworks(args.framework.as_deref(), &base)?;
    if let [f] = searched[..] {
        base.training.framework = f;
    }
    // The search replaces the split: the scenario's own need not be valid, nor runnable.
    let own = base.parallel.validate(&base.model, &base.cluster).err().map(|e| e.to_string());
    if let Some(e) = own.or_else(|| base.training.framework.check(&base).err().map(|e| e.to_string())) {
        eprintln!(
            "search: the scenario's own split is not valid, so it is not ranked ({e}); searching from its model, cluster and batch"
        );
    }
    if let Some(gpus) = args.gpus {
        let gpn = base.cluster.gpus_per_node as u64;
        if gpus == 0 || !gpus.is_multiple_of(gpn) {
            anyhow::bail!("--gpus {gpus} is not a whole number of {}-GPU nodes", gpn);
        }
        base.cluster.nodes = u32::try_from(gpus / gpn).context("--gpus is too large")?;
        // The base split may not fit the new size; the search does not need it to.
        base.parallel.dp =
            u32::try_from(gpus / (base.parallel.tp as u64 * base.parallel.pp as u64).max(1)).unwrap_or(1).max(1);
    }
    let mut opts = SearchOptions::new(&base);
    opts.space = if args.splits_only { SearchSpace::splits(&base) } else { SearchSpace::full(&base) };
    opts.space.frameworks = searched;
    opts.simulate_top = args.simulate;
    opts.exhaustive = args.exhaustive;
    opts.network = args.sim.network_kind();
    opts.profile = args.sim.profile()?;
    if let Some(seed) = args.sim.seed {
        opts.seed = seed;
    }
    let bar = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template("{msg:>12} [{bar:40}] {pos}/{len} ({elapsed})")
            .context("the progress bar's template")?
            .progress_chars("=> "),
    );
    let start = Instant::now();
    let result = search::search(&base, &opts, &|phase, done, total| {
        bar.set_message(match phase {
            Progress::Screening => "screening",
            Progress::Simulating => "simulating",
        });
        bar.set_length(total);
        bar.set_position(done);
    })?;
    bar.finish_and_clear();
    let wall = start.elapsed().as_secs_f64();
    let written = match &args.out {
        Some(dir) => write_out(dir, &base, &result)?,
        None => Vec::new(),
    };
    if args.json {
        return common::print_json(&JsonResult {
            result: &result,
            wall_s: wall,
            top: top_rows(&result, args.top),
            winner_memory: result.best().and_then(|b| WinnerMemory::of(&b.scenario)),
        });
    }
    print!("{}", text(&base, &result, args.top, wall));
    if let Some(dir) = &args.out {
        println!("\nwrote {}: {}", dir.display(), written.join(", "));
    }
    Ok(())
}

#[derive(serde::Serialize)]
struct JsonResult<'a> {
    #[serde(flatten)]
    result: &'a SearchResult,
    wall_s: f64,
    top: Vec<&'a Candidate>,
    winner_memory: Option<WinnerMemory>,
}

/// The winner's memory by its framework's own formula, on its fullest stage.
#[derive(serde::Serialize)]
struct WinnerMemory {
    framework: Framework,
    stage: u32,
    /// Weights, gradients and optimizer state (with the formula's own buffer term).
    states_bytes: f64,
    /// Activations, embedding and logits buffers.
    activations_bytes: f64,
    /// States plus activations: the framework's formula.
    formula_bytes: f64,
    /// What Strata's plan holds on top (transient working sets).
    strata_extra_bytes: f64,
}

impl WinnerMemory {
    fn of(s: &Scenario) -> Option<WinnerMemory> {
        let stages = memory::stage_memory(s);
        let st = stages.iter().max_by(|a, b| a.framework_formula_bytes().total_cmp(&b.framework_formula_bytes()))?;
        Some(WinnerMemory {
            framework: s.training.framework,
            stage: st.stage,
            states_bytes: st.states_bytes() + st.formula_only_bytes,
            activations_bytes: st.activations_bytes + st.embedding_logits_bytes,
            formula_bytes: st.framework_formula_bytes(),
            strata_extra_bytes: st.strata_extra_bytes(),
        })
    }
}

fn top_rows(r: &SearchResult, k: usize) -> Vec<&Candidate> {
    r.ranking.iter().take(k).map(|i| &r.candidates[*i]).collect()
}

fn text(base: &Scenario, r: &SearchResult, top: usize, wall: f64) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "search: {} on {} × {}, global batch {}, sequence {}",
        base.model.name,
        base.cluster.gpus(),
        base.cluster.gpu,
        base.parallel.global_batch,
        base.model.seq_len
    );
    let invalid: u64 = r.invalid.values().sum();
    let unrunnable: u64 = r.unrunnable.values().sum();
    let _ = writeln!(
        o,
        "candidates: {} enumerated — {} duplicates of others, {} invalid, {} unrunnable by the framework, {} valid; {} out of memory (analytic), {} estimated, {} simulated ({} out of memory); {:.1} s, {:.0} candidates/s\n",
        r.enumerated,
        r.duplicates,
        invalid,
        unrunnable,
        r.valid,
        r.out_of_memory_analytic,
        r.estimated,
        r.simulated,
        r.out_of_memory_simulated,
        wall,
        r.enumerated as f64 / wall.max(1e-9)
    );
    if r.ranking.is_empty() {
        match &r.infeasible {
            Some(s) => {
                let _ = writeln!(
                    o,
                    "Nothing fits. The closest candidate, {}, needs {} per GPU; the GPU has {} ({} short).\nTry more GPUs, a smaller micro-batch or sequence, or a GPU with more memory.",
                    s.label,
                    common::bytes(s.needed_bytes),
                    common::bytes(s.available_bytes),
                    common::bytes(s.needed_bytes - s.available_bytes)
                );
            }
            None => {
                let _ = writeln!(o, "No valid candidate: every combination breaks a rule (see the counts below).");
            }
        }
    } else {
        // Expert all-to-all and imbalance columns for a MoE model, the CP exchange where a
        // ranked candidate splits the sequence.
        let moe = base.model.moe.is_some();
        let cp = r.ranking.iter().any(|&i| r.candidates[i].scenario.parallel.cp > 1);
        // A host-bound column where a ranked candidate waits on its framework's host work.
        let rows = search_ties::rows(r, top);
        let host = rows.iter().any(|row| row.report.breakdown_s.host_bound > 0.0);
        let mut extra_head = String::new();
        if moe {
            extra_head += &format!(" {:>5} {:>5}", "a2a", "imbal");
        }
        if cp {
            extra_head += &format!(" {:>5}", "cp");
        }
        if host {
            extra_head += &format!(" {:>5}", "host");
        }
        let _ = writeln!(
            o,
            "{:>3}  {:<44} {:>10} {:>9} {:>11} {:>6}  {:>7} {:>5} {:>5} {:>5} {:>6} {:>5}{extra_head}",
            "#", "split", "memory", "step (s)", "tokens/s", "MFU", "compute", "tp", "dp", "pp", "bubble", "optim"
        );
        // Ranked candidates are simulated; one without a report has no row to show. Exact
        // ties share a row (the CSV and the JSON keep every candidate).
        for (rank, row) in rows.iter().enumerate() {
            let rep = row.report;
            let b = &rep.breakdown_s;
            let pct = |x: f64| 100.0 * x / rep.step_time_s;
            let peak = rep.peak_memory_bytes.iter().copied().max().unwrap_or(0);
            let mut extra = String::new();
            if moe {
                extra += &format!(" {:>4.1}% {:>4.1}%", pct(b.ep_exposed), pct(b.moe_imbalance));
            }
            if cp {
                extra += &format!(" {:>4.1}%", pct(b.cp_exposed));
            }
            if host {
                extra += &format!(" {:>4.1}%", pct(b.host_bound));
            }
            let _ = writeln!(
                o,
                "{:>3}  {:<44} {:>10} {:>9.3} {:>11} {:>5.1}%  {:>6.1}% {:>4.1}% {:>4.1}% {:>4.1}% {:>5.1}% {:>4.1}%{extra}",
                rank + 1,
                row.label,
                common::bytes(peak as f64),
                rep.step_time_s,
                common::count(rep.tokens_per_s),
                100.0 * rep.mfu,
                pct(b.compute),
                pct(b.tp_exposed),
                pct(b.dp_exposed),
                pct(b.pp_exposed),
                pct(b.bubble),
                pct(b.optimizer)
            );
        }
    }
    if let Some((best, w)) = r.best().and_then(|b| Some((b, WinnerMemory::of(&b.scenario)?))) {
        let _ = writeln!(
            o,
            "\nwinner {} runs under {}; its memory by {}'s formula on stage {}: {} (weights, gradients, optimizer {} + activations {}), Strata's plan adds {} of transients",
            best.label,
            best.framework.name(),
            best.framework.name(),
            w.stage,
            common::bytes(w.formula_bytes),
            common::bytes(w.states_bytes),
            common::bytes(w.activations_bytes),
            common::bytes(w.strata_extra_bytes)
        );
    }
    let _ = writeln!(o, "\nrejected as invalid, by rule:");
    for (rule, n) in &r.invalid {
        let _ = writeln!(o, "  {rule:<26} {n}");
    }
    let names: Vec<&str> = r.frameworks.iter().map(|f| f.key()).collect();
    let _ = writeln!(
        o,
        "excluded as unrunnable under {}, by rule: {}",
        names.join(", "),
        if r.unrunnable.is_empty() { "none" } else { "" }
    );
    for (rule, n) in &r.unrunnable {
        let _ = writeln!(o, "  {rule:<26} {n}");
    }
    if let (Some(b), Some(best)) = (r.base.map(|i| &r.candidates[i]), r.best()) {
        let _ = writeln!(
            o,
            "\nthe scenario's own split, {}: {}",
            b.label,
            match b.tokens_per_s() {
                Some(t) => format!(
                    "{} tokens/s, rank {} — the winner is {:.1}% faster ({})",
                    common::count(t),
                    r.ranking.iter().position(|i| r.candidates[*i].label == b.label).map(|p| p + 1).unwrap_or(0),
                    100.0 * (best.tokens_per_s().unwrap_or(t) / t - 1.0),
                    differences(&b.scenario, &best.scenario)
                ),
                None => "does not fit".to_string(),
            }
        );
    }
    o
}

/// What the winner changes relative to another split.
fn differences(a: &Scenario, b: &Scenario) -> String {
    let (p, q) = (&a.parallel, &b.parallel);
    let mut d = Vec::new();
    let mut diff = |name: &str, x: String, y: String| {
        if x != y {
            d.push(format!("{name} {x} → {y}"));
        }
    };
    diff("tp", p.tp.to_string(), q.tp.to_string());
    diff("pp", p.pp.to_string(), q.pp.to_string());
    diff("dp", p.dp.to_string(), q.dp.to_string());
    diff("schedule", p.schedule.key().into(), q.schedule.key().into());
    diff("vpp", p.vpp.to_string(), q.vpp.to_string());
    diff("micro_batch", p.micro_batch.to_string(), q.micro_batch.to_string());
    diff("zero", p.zero.to_string(), q.zero.to_string());
    diff("recompute", p.recompute.key().into(), q.recompute.key().into());
    diff("sequence_parallel", p.sequence_parallel.to_string(), q.sequence_parallel.to_string());
    diff("grad_bucket_mb", p.grad_bucket_mb.to_string(), q.grad_bucket_mb.to_string());
    diff("overlap_grad_reduce", p.overlap_grad_reduce.to_string(), q.overlap_grad_reduce.to_string());
    diff("overlap_param_gather", p.overlap_param_gather.to_string(), q.overlap_param_gather.to_string());
    diff("tp_comm_overlap", a.tp_comm_overlap().to_string(), b.tp_comm_overlap().to_string());
    diff("framework", a.training.framework.key().into(), b.training.framework.key().into());
    if d.is_empty() { "the same split".into() } else { d.join(", ") }
}

/// Writes the search's files into `dir`; returns their names.
fn write_out(dir: &Path, base: &Scenario, r: &SearchResult) -> anyhow::Result<Vec<String>> {
    common::create_dir(dir)?;
    let write = |name: &str, text: String| common::write_file(&dir.join(name), text);
    let mut csv = String::from(
        "label,tp,pp,dp,vpp,schedule,micro_batch,zero,recompute,sequence_parallel,grad_bucket_mb,overlap_grad_reduce,overlap_param_gather,status,memory_estimate_bytes,estimate_step_s,simulated_step_s,tokens_per_s,mfu,fits\n",
    );
    for c in &r.candidates {
        let p = &c.scenario.parallel;
        let rep = c.report.as_ref();
        let _ = writeln!(
            csv,
            "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{:.0},{},{},{},{},{}",
            c.label,
            p.tp,
            p.pp,
            p.dp,
            p.vpp,
            p.schedule.key(),
            p.micro_batch,
            p.zero,
            p.recompute.key(),
            p.sequence_parallel,
            p.grad_bucket_mb,
            p.overlap_grad_reduce,
            p.overlap_param_gather,
            serde_json::to_value(&c.status).ok().and_then(|v| v.as_str().map(String::from)).unwrap_or_default(),
            c.memory_estimate_bytes,
            c.estimate_step_s.map(|v| format!("{v:.6}")).unwrap_or_default(),
            rep.map(|x| format!("{:.6}", x.step_time_s)).unwrap_or_default(),
            rep.map(|x| format!("{:.1}", x.tokens_per_s)).unwrap_or_default(),
            rep.map(|x| format!("{:.4}", x.mfu)).unwrap_or_default(),
            rep.map(|x| x.fits.to_string()).unwrap_or_default(),
        );
    }
    write("candidates.csv", csv)?;
    let mut names = vec!["candidates.csv".to_string()];
    let Some(best) = r.best() else {
        return Ok(names);
    };
    let s = Scenario { name: format!("{}-best", base.name), ..best.scenario.clone() };
    write("best.toml", format!("# The fastest split the search found for {}.\n{}", base.name, s.to_toml()))?;
    let plan = plan::lower(&s)?;
    write("plan.json", serde_json::to_string(&plan).context("serialising the plan")?)?;
    names.extend(["best.toml".to_string(), "plan.json".to_string()]);
    // The launch files of the framework that runs the winner, through `strata export`'s code;
    // what they cannot express is dropped with a warning rather than failing the search.
    let framework = s.training.framework;
    if framework != Framework::Strata {
        let export = strata_models::export::export(&s, framework, true)?;
        for d in &export.dropped {
            eprintln!("warning: {} export of the winner drops {d}", framework.name());
        }
        crate::cmd::export::write_files(dir, &export)?;
        names.extend(export.files.iter().map(|f| f.name.to_string()));
    }
    Ok(names)
}
