//! `strata goodput`'s report as text: the inputs it resolved, Young's and Daly's intervals,
//! one row per interval tried, the best one with its time to train, and the lost GPU-hours
//! by cause there.

use std::fmt::Write;

use strata_models::Scenario;
use strata_models::faults::failures::{Distribution, Unit};
use strata_sim::goodput::{GoodputResult, Inputs, IntervalResult, Save};

use crate::common;

/// A duration in the unit that reads best.
pub fn dur(s: f64) -> String {
    if !s.is_finite() {
        "∞".to_string()
    } else if s >= 2.0 * 86_400.0 {
        format!("{:.2} d", s / 86_400.0)
    } else if s >= 3.0 * 3600.0 {
        format!("{:.2} h", s / 3600.0)
    } else if s >= 120.0 {
        format!("{:.1} min", s / 60.0)
    } else {
        format!("{s:.2} s")
    }
}

fn pct(x: f64) -> String {
    format!("{:.2}%", 100.0 * x)
}

pub fn text(s: &Scenario, inp: &Inputs, r: &GoodputResult) -> String {
    let mut o = String::new();
    let steps = inp.work_s / inp.step_s;
    let _ = writeln!(
        o,
        "goodput of {} on {} × {}: {} of failure-free training ({} steps of {:.3} s), {} trials, seed {}\n",
        s.model.name,
        inp.gpus,
        s.cluster.gpu,
        dur(inp.work_s),
        common::count(steps),
        inp.step_s,
        r.trials,
        r.seed
    );
    inputs_text(&mut o, inp);
    let _ = writeln!(
        o,
        "\nYoung τ = {}; Daly τ_opt = {} ({} steps), Daly efficiency {}",
        dur(r.young_tau_s),
        dur(r.daly_tau_s),
        inp.steps_of(r.daly_tau_s),
        pct(r.daly_efficiency)
    );
    let _ = writeln!(
        o,
        "\n{:>10} {:>8}  {:>26}  {:>28}  {:>9}",
        "interval", "steps", "goodput [95% CI]", "time to train [95% CI]", "Daly"
    );
    for (i, iv) in r.intervals.iter().enumerate() {
        let mark = if i == r.best { " ← best" } else { "" };
        let mine = inp.scenario_interval_s.is_some_and(|t| inp.steps_of(t) == iv.interval_steps);
        let _ = writeln!(
            o,
            "{:>10} {:>8}  {:>8} [{:.2}, {:.2}]%  {:>10} [{}, {}]  {:>9}{mark}{}{}",
            dur(iv.interval_s),
            iv.interval_steps,
            pct(iv.goodput),
            100.0 * iv.goodput_lo,
            100.0 * iv.goodput_hi,
            dur(iv.mean_wall_s),
            dur(iv.mean_wall_s - iv.ci95_wall_s),
            dur(iv.mean_wall_s + iv.ci95_wall_s),
            pct(iv.daly_efficiency),
            if mine { " (the scenario's interval)" } else { "" },
            if iv.unfinished > 0 { format!(" ({} trials hit the cap)", iv.unfinished) } else { String::new() }
        );
    }
    best_text(&mut o, inp, r.best());
    o
}

fn inputs_text(o: &mut String, inp: &Inputs) {
    let _ = writeln!(o, "failures (job MTBF {}):", dur(inp.job_mtbf_s()));
    if inp.processes.is_empty() {
        let _ = writeln!(o, "  none");
    }
    for p in &inp.processes {
        let dist = match p.distribution {
            Distribution::Exponential => "exponential".to_string(),
            Distribution::Weibull => format!("Weibull k = {}", p.shape),
        };
        let unit = match p.cause.unit() {
            Unit::Gpu => "GPUs",
            Unit::Node => "nodes",
            Unit::Job => "job",
        };
        let _ = writeln!(
            o,
            "  {:<9} MTBF {:>12.0} h per unit, {dist:<16} × {:>6} {unit:<5} → one every {}",
            p.cause.key(),
            p.mtbf_hours,
            p.units,
            dur(p.mtbf_hours * 3600.0 / p.units as f64)
        );
    }
    let save = match inp.save {
        Save::Sync { block_s } => format!("sync, blocks {block_s:.2} s"),
        Save::Async { block_s, write_s } => {
            format!("async, blocks {block_s:.2} s (staging), durable {write_s:.2} s later (background write)")
        }
    };
    let _ = writeln!(
        o,
        "checkpoint: {} ({} per rank at most), {save}",
        common::bytes(inp.checkpoint_bytes),
        common::bytes(inp.shard_bytes_max)
    );
    let r = &inp.restart;
    let _ = writeln!(
        o,
        "restart: {:.1} s = detect {:.0} + reschedule {:.0} + NCCL init {:.0} + load {:.2}",
        r.total_s(),
        r.detect_s,
        r.reschedule_s,
        r.init_s,
        r.load_s
    );
}

fn best_text(o: &mut String, inp: &Inputs, b: &IntervalResult) {
    let _ = writeln!(
        o,
        "\nbest interval (Monte Carlo): {} ({} steps): goodput {} [{:.2}, {:.2}]%; time to train {} [{}, {}], \
         5–95% of runs {} – {}",
        dur(b.interval_s),
        b.interval_steps,
        pct(b.goodput),
        100.0 * b.goodput_lo,
        100.0 * b.goodput_hi,
        dur(b.mean_wall_s),
        dur(b.mean_wall_s - b.ci95_wall_s),
        dur(b.mean_wall_s + b.ci95_wall_s),
        dur(b.p05_wall_s),
        dur(b.p95_wall_s)
    );
    let total = (b.mean_wall_s - inp.work_s) / 3600.0 * inp.gpus as f64;
    let _ = writeln!(o, "lost GPU-hours per run there (mean; {} in all):", common::count(total));
    let _ = writeln!(o, "  {:<11} {:>12} {:>14} {:>14}", "cause", "failures", "lost work", "restarts");
    let _ = writeln!(o, "  {:<11} {:>12} {:>14} {:>14}", "checkpoint", "-", common::count(b.checkpoint_gpu_hours), "-");
    for l in &b.losses {
        let _ = writeln!(
            o,
            "  {:<11} {:>12.1} {:>14} {:>14}",
            l.cause.key(),
            l.failures,
            common::count(l.lost_work_gpu_hours),
            common::count(l.restart_gpu_hours)
        );
    }
}
