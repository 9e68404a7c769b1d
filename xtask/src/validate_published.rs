//! `cargo xtask validate --published`: the simulator against published training runs.
//!
//! The rows live in `xtask/data/published.toml` (compiled in, so the suite needs no
//! network): the **fit** set — figures the hardware profiles were fitted to — and the
//! **check** set — whole-run figures kept only for checking, never for tuning. Each row
//! carries its source, what the row had to assume, the published figure and the scenario
//! (model, cluster, split, framework) as Strata reads it. Every row is lowered and
//! simulated (the default profile of its GPU, seed 0) and compared on its metric; the
//! command prints per-row predicted against published and the mean absolute percentage
//! error (MAPE) per group, then the check set again with each framework mechanic
//! ([`strata_models::framework::mechanics::Mechanic`]) turned off in turn and all of them
//! off — what each mechanic changes. `--json` prints the same as one JSON document.

use std::collections::BTreeMap;

use anyhow::{Context, bail};
use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};
use strata_models::Scenario;
use strata_models::framework::mechanics::{Mechanic, set_disabled};
use strata_models::plan::lower;
use strata_sim::{SimOptions, simulate};

/// The suite's rows, with their sources.
pub const DATA: &str = include_str!("../data/published.toml");

/// What a row's published figure measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Metric {
    /// Seconds per optimizer step.
    StepS,
    /// Megatron-LM's TFLOP/s per GPU with full recomputation counted (Narayanan et al.
    /// SC'21): 96·B·s·l·h²·(1 + s/6h + V/16lh) per step.
    MegatronTflopsPerGpu,
    /// The same without recomputation: 72·B·s·l·h²·(1 + s/6h + V/12lh) per step (the
    /// "TFLOPS ignoring checkpointing" of DeepSpeed PR #1453: × 4/3 gives the other; and
    /// Megatron-LM's 2024 `num_floating_point_operations` for multi-head attention and a 4h
    /// MLP).
    ModelTflopsPerGpu,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Row {
    pub group: String,
    pub name: String,
    pub source: String,
    #[serde(default)]
    pub assumed: String,
    pub metric: Metric,
    pub value: f64,
    pub scenario: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Data {
    pub fit: Vec<Row>,
    pub check: Vec<Row>,
}

/// Parses the suite's data file.
pub fn load() -> anyhow::Result<Data> {
    toml::from_str(DATA).context("xtask/data/published.toml")
}

impl Row {
    /// The row's scenario, validated.
    pub fn scenario(&self) -> anyhow::Result<Scenario> {
        let s = Scenario::from_toml(&self.scenario, &self.name, "published", &[])
            .map_err(|e| anyhow::anyhow!("row \"{}\": {e}", self.name))?;
        s.validate().map_err(|e| anyhow::anyhow!("row \"{}\": {e}", self.name))?;
        Ok(s)
    }

    /// The row's metric for a step of `step_s` seconds of scenario `s`.
    pub fn metric_of(&self, s: &Scenario, step_s: f64) -> f64 {
        let m = &s.model;
        let (b, sq, l, h, v) =
            (s.parallel.global_batch as f64, m.seq_len as f64, m.layers as f64, m.hidden as f64, m.vocab as f64);
        let gpus = (s.parallel.tp * s.parallel.pp * s.parallel.dp) as f64;
        let per_step =
            |k: f64, vocab_div: f64| k * b * sq * l * h * h * (1.0 + sq / (6.0 * h) + v / (vocab_div * l * h));
        match self.metric {
            Metric::StepS => step_s,
            Metric::MegatronTflopsPerGpu => per_step(96.0, 16.0) / step_s / gpus / 1e12,
            Metric::ModelTflopsPerGpu => per_step(72.0, 12.0) / step_s / gpus / 1e12,
        }
    }

    /// Lowers and simulates the row; its predicted metric.
    pub fn predict(&self) -> anyhow::Result<f64> {
        let s = self.scenario()?;
        let plan = lower(&s).map_err(|e| anyhow::anyhow!("row \"{}\": {e}", self.name))?;
        let r = simulate(&plan, &SimOptions::default()).map_err(|e| anyhow::anyhow!("row \"{}\": {e}", self.name))?;
        Ok(self.metric_of(&s, r.step_time_s))
    }
}

#[derive(Debug, Serialize)]
struct RowResult {
    set: &'static str,
    group: String,
    name: String,
    metric: Metric,
    published: f64,
    predicted: f64,
    /// predicted / published − 1.
    error: f64,
    source: String,
    assumed: String,
}

/// Mean absolute percentage error per group, in row order of first appearance.
fn mape(rows: &[RowResult]) -> Vec<(String, usize, f64)> {
    let mut acc: BTreeMap<&str, (usize, f64, usize)> = BTreeMap::new();
    for (i, r) in rows.iter().enumerate() {
        let e = acc.entry(&r.group).or_insert((0, 0.0, i));
        e.0 += 1;
        e.1 += r.error.abs();
    }
    let mut out: Vec<(usize, String, usize, f64)> =
        acc.into_iter().map(|(g, (n, sum, first))| (first, g.to_string(), n, 100.0 * sum / n as f64)).collect();
    out.sort_by_key(|x| x.0);
    out.into_iter().map(|(_, g, n, m)| (g, n, m)).collect()
}

fn run_rows(set: &'static str, rows: &[Row], bar: &ProgressBar) -> anyhow::Result<Vec<RowResult>> {
    let mut out = Vec::new();
    for r in rows {
        bar.set_message(r.name.clone());
        let predicted = r.predict()?;
        bar.inc(1);
        out.push(RowResult {
            set,
            group: r.group.clone(),
            name: r.name.clone(),
            metric: r.metric,
            published: r.value,
            predicted,
            error: predicted / r.value - 1.0,
            source: r.source.clone(),
            assumed: r.assumed.clone(),
        });
    }
    Ok(out)
}

/// The check set's MAPE per group with the given mechanics off.
fn check_mape(data: &Data, off: &[Mechanic], bar: &ProgressBar) -> anyhow::Result<Vec<(String, usize, f64)>> {
    set_disabled(off);
    let r = run_rows("check", &data.check, bar);
    set_disabled(&[]);
    Ok(mape(&r?))
}

/// The command line of `validate --published`.
#[derive(Debug, Default)]
pub struct Options {
    /// One JSON document instead of the tables.
    pub json: bool,
    /// Keep only the rows whose group or name contains this text (quicker runs while
    /// working on one group).
    pub rows: Option<String>,
    /// Skip the check set's mechanic-off runs.
    pub no_ablations: bool,
}

impl Options {
    pub fn parse(args: &[String]) -> anyhow::Result<Options> {
        let mut o = Options::default();
        let mut it = args.iter();
        while let Some(a) = it.next() {
            match a.as_str() {
                "--json" => o.json = true,
                "--no-ablations" => o.no_ablations = true,
                "--rows" => match it.next() {
                    Some(t) => o.rows = Some(t.clone()),
                    None => bail!("--rows needs the text a row's group or name must contain"),
                },
                other => bail!(
                    "validate --published: unknown argument \"{other}\" (takes --json, --rows TEXT, --no-ablations)"
                ),
            }
        }
        Ok(o)
    }
}

pub fn validate_published(opts: &Options) -> anyhow::Result<()> {
    let json = opts.json;
    let mut data = load()?;
    if let Some(t) = &opts.rows {
        let keep = |r: &Row| r.group.contains(t.as_str()) || r.name.contains(t.as_str());
        data.fit.retain(keep);
        data.check.retain(keep);
    }
    if data.check.is_empty() {
        bail!("no check rows (xtask/data/published.toml, filtered by --rows)");
    }
    let variants: Vec<(String, Vec<Mechanic>)> = if opts.no_ablations {
        Vec::new()
    } else {
        Mechanic::ALL
            .iter()
            .map(|m| (format!("without {}", m.key()), vec![*m]))
            .chain([("without any".to_string(), Mechanic::ALL.to_vec())])
            .collect()
    };
    let total = data.fit.len() + data.check.len() * (1 + variants.len());
    let bar = ProgressBar::with_draw_target(Some(total as u64), indicatif::ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} {msg}").unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    if !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    let mut rows = run_rows("fit", &data.fit, &bar)?;
    rows.extend(run_rows("check", &data.check, &bar)?);
    let with_all = mape(&rows.iter().filter(|r| r.set == "check").map(clone_row).collect::<Vec<_>>());
    let mut ablations = Vec::new();
    for (label, off) in &variants {
        ablations.push((label.clone(), check_mape(&data, off, &bar)?));
    }
    bar.finish_and_clear();
    let fit: Vec<RowResult> = rows.iter().filter(|r| r.set == "fit").map(clone_row).collect();
    if json {
        let groups = |rs: &[(String, usize, f64)]| {
            rs.iter().map(|(g, n, m)| serde_json::json!({"group": g, "rows": n, "mape_percent": m})).collect::<Vec<_>>()
        };
        let doc = serde_json::json!({
            "rows": rows,
            "fit": groups(&mape(&fit)),
            "check": groups(&with_all),
            "check_without": ablations.iter().map(|(l, g)| serde_json::json!({"variant": l, "groups": groups(g)})).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(());
    }
    println!("{:<5} {:<32} {:<44} {:>10} {:>10} {:>8}", "set", "group", "row", "published", "predicted", "error");
    for r in &rows {
        let unit = match r.metric {
            Metric::StepS => "s",
            _ => "TF",
        };
        println!(
            "{:<5} {:<32} {:<44} {:>8.2}{unit:<2} {:>8.2}{unit:<2} {:>+7.1}%",
            r.set,
            r.group,
            r.name,
            r.published,
            r.predicted,
            100.0 * r.error
        );
    }
    println!("\nMAPE per group");
    println!("{:<5} {:<32} {:>4} {:>8}", "set", "group", "rows", "MAPE");
    for (set, groups) in [("fit", mape(&fit)), ("check", with_all.clone())] {
        for (g, n, m) in groups {
            println!("{set:<5} {g:<32} {n:>4} {m:>7.1}%");
        }
    }
    println!("\nWhat each framework mechanic changes on the check set (MAPE per group)");
    let mut header = format!("{:<32} {:>10}", "group", "all on");
    for (l, _) in &ablations {
        header.push_str(&format!(" {:>26}", l));
    }
    println!("{header}");
    for (i, (g, _, m)) in with_all.iter().enumerate() {
        let mut line = format!("{g:<32} {m:>9.1}%");
        for (_, a) in &ablations {
            line.push_str(&format!(" {:>25.1}%", a[i].2));
        }
        println!("{line}");
    }
    Ok(())
}

fn clone_row(r: &RowResult) -> RowResult {
    RowResult {
        set: r.set,
        group: r.group.clone(),
        name: r.name.clone(),
        metric: r.metric,
        published: r.published,
        predicted: r.predicted,
        error: r.error,
        source: r.source.clone(),
        assumed: r.assumed.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_row_parses_and_its_scenario_validates() {
        let data = load().unwrap();
        assert!(!data.fit.is_empty() && !data.check.is_empty());
        for r in data.fit.iter().chain(&data.check) {
            assert!(!r.source.is_empty(), "{}: no source", r.name);
            assert!(r.value > 0.0, "{}", r.name);
            let s = r.scenario().unwrap();
            // The row's framework rules hold (a published run ran on its framework).
            s.training.framework.check(&s).unwrap();
        }
    }

    #[test]
    fn the_metrics_invert_a_step_time() {
        // Megatron's 96-factor formula for GPT-3 175B at B = 1536, s = 2048 on 1024 GPUs.
        let data = load().unwrap();
        let row = Row { metric: Metric::MegatronTflopsPerGpu, ..data.check[0].clone() };
        let s = Scenario::from_toml(
            "[model]\npreset = \"gpt3-175b\"\n[cluster]\npreset = \"dgx-a100\"\nnodes = 128\n[parallel]\ntp = 8\npp = 8\ndp = 16\nglobal_batch = 1536\nmicro_batch = 1\n",
            "t",
            "t",
            &[],
        )
        .unwrap();
        let flops = 96.0
            * 1536.0
            * 2048.0
            * 96.0
            * 12288f64.powi(2)
            * (1.0 + 2048.0 / (6.0 * 12288.0) + s.model.vocab as f64 / (16.0 * 96.0 * 12288.0));
        let tf = row.metric_of(&s, 10.0);
        assert!((tf - flops / 10.0 / 1024.0 / 1e12).abs() < 1e-9);
        let m = Row { metric: Metric::ModelTflopsPerGpu, ..row.clone() };
        // Without recomputation: 3/4 of the FLOPs (but the vocabulary term's 12 vs 16).
        assert!(m.metric_of(&s, 10.0) < tf && m.metric_of(&s, 10.0) > 0.74 * tf);
    }

    #[test]
    fn the_suite_runs_on_its_smallest_rows() {
        // The whole suite is `cargo xtask validate --published`; here the rows that
        // simulate quickly, so the path from data to figure is tested.
        let data = load().unwrap();
        let r = data.check.iter().find(|r| r.name.contains("10B")).unwrap();
        let p = r.predict().unwrap();
        assert!(p.is_finite() && p > 0.0);
        let f = data.fit.iter().find(|r| r.name.contains("22B")).unwrap();
        assert!(f.predict().unwrap() > 0.0);
    }
}
