//! The input directory that `strata report DIR` reads, and that `strata compare` (or any
//! caller) writes with [`save_inputs`].
//!
//! ```text
//! DIR/comparisons.json                 {"title": …, "plans": [PlanComparison…]}   (numbers only)
//! DIR/landscape.csv                    tp,pp,tokens_per_s,label      (empty tokens_per_s = OOM/invalid)
//! DIR/plans/<slug>/plan.json           the lowered Plan the traces refer to
//! DIR/plans/<slug>/predicted-trace.json  a strata Trace (simulated)
//! DIR/plans/<slug>/measured-trace.json   a strata Trace (measured)
//! DIR/plans/<slug>/predicted-memory.csv  rank,t_ns,bytes
//! DIR/plans/<slug>/measured-memory.csv   rank,t_ns,bytes
//! ```
//!
//! Only one of `comparisons.json` and `landscape.csv` is required; every file under
//! `plans/` is optional (a plan without traces gets no timeline plot). `<slug>` is the
//! plan's name with characters other than ASCII letters, digits, `.`, `_`, `-` replaced by
//! `-`. Errors name the file and say what is wrong in it.

use std::path::Path;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use strata_models::plan::CheckedPlan;
use strata_models::trace::MemSample;

use crate::error::{ReportError, write_file};
use crate::inputs::{ComparisonSet, PlanComparison, ReportInputs, SearchLandscape};

pub const COMPARISONS: &str = "comparisons.json";
pub const LANDSCAPE: &str = "landscape.csv";
const PLAN: &str = "plan.json";
const PREDICTED_TRACE: &str = "predicted-trace.json";
const MEASURED_TRACE: &str = "measured-trace.json";
const PREDICTED_MEMORY: &str = "predicted-memory.csv";
const MEASURED_MEMORY: &str = "measured-memory.csv";

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ComparisonsFile {
    #[serde(default)]
    title: String,
    plans: Vec<PlanComparison>,
}

/// Reads a report's inputs from `dir` and validates them.
pub fn load_inputs(dir: &Path) -> Result<ReportInputs, ReportError> {
    if !dir.is_dir() {
        return Err(ReportError::Missing {
            path: dir.to_path_buf(),
            what: "give the directory that `strata compare` or `strata search` wrote",
        });
    }
    let comparisons_path = dir.join(COMPARISONS);
    let landscape_path = dir.join(LANDSCAPE);
    if !comparisons_path.exists() && !landscape_path.exists() {
        return Err(ReportError::Missing {
            path: comparisons_path,
            what: "a report directory needs comparisons.json (plans run both ways) or landscape.csv (a search)",
        });
    }
    let mut inputs = ReportInputs::default();
    if comparisons_path.exists() {
        let file: ComparisonsFile = read_json(&comparisons_path)?;
        inputs.title = file.title;
        inputs.comparisons = ComparisonSet { plans: file.plans };
        for p in &mut inputs.comparisons.plans {
            load_timelines(&dir.join("plans").join(p.slug()), p)?;
        }
    }
    if landscape_path.exists() {
        inputs.landscape = Some(SearchLandscape { cells: read_csv(&landscape_path)? });
    }
    inputs.validate(&dir.display().to_string())?;
    Ok(inputs)
}

fn load_timelines(dir: &Path, p: &mut PlanComparison) -> Result<(), ReportError> {
    let t = &mut p.timelines;
    t.plan = read_json_opt(&dir.join(PLAN))?;
    // The report indexes the plan's programs and costs by the traces' op ids: a plan edited
    // by hand must be checked first.
    if let Some(plan) = t.plan.take() {
        let checked = CheckedPlan::new(plan)
            .map_err(|e| ReportError::invalid(dir.join(PLAN).display().to_string(), e.to_string()))?;
        t.plan = Some(checked.into_inner());
    }
    t.predicted_trace = read_json_opt(&dir.join(PREDICTED_TRACE))?;
    t.measured_trace = read_json_opt(&dir.join(MEASURED_TRACE))?;
    for (name, samples) in [(PREDICTED_MEMORY, &mut t.predicted_memory), (MEASURED_MEMORY, &mut t.measured_memory)] {
        let path = dir.join(name);
        if path.exists() {
            *samples = read_csv::<MemSample>(&path)?;
            samples.sort_by_key(|m| (m.rank, m.t_ns, m.bytes));
        }
    }
    for trace in [&mut t.predicted_trace, &mut t.measured_trace].into_iter().flatten() {
        trace.canonicalize();
    }
    Ok(())
}

/// Writes `inputs` to `dir` in the layout above (deterministic bytes).
pub fn save_inputs(dir: &Path, inputs: &ReportInputs) -> Result<(), ReportError> {
    inputs.validate("inputs to save")?;
    let file = ComparisonsFile {
        title: inputs.title.clone(),
        plans: inputs.comparisons.plans.iter().map(PlanComparison::without_timelines).collect(),
    };
    let mut json = serde_json::to_string_pretty(&file).expect("plain data serialises");
    json.push('\n');
    write_file(&dir.join(COMPARISONS), json.as_bytes())?;
    if let Some(l) = &inputs.landscape {
        write_csv(&dir.join(LANDSCAPE), &l.cells)?;
    }
    for p in &inputs.comparisons.plans {
        let d = dir.join("plans").join(p.slug());
        let t = &p.timelines;
        if let Some(plan) = &t.plan {
            write_json(&d.join(PLAN), plan)?;
        }
        if let Some(tr) = &t.predicted_trace {
            write_json(&d.join(PREDICTED_TRACE), tr)?;
        }
        if let Some(tr) = &t.measured_trace {
            write_json(&d.join(MEASURED_TRACE), tr)?;
        }
        if !t.predicted_memory.is_empty() {
            write_csv(&d.join(PREDICTED_MEMORY), &t.predicted_memory)?;
        }
        if !t.measured_memory.is_empty() {
            write_csv(&d.join(MEASURED_MEMORY), &t.measured_memory)?;
        }
    }
    Ok(())
}

fn read_json<T: DeserializeOwned>(path: &Path) -> Result<T, ReportError> {
    let text = std::fs::read_to_string(path).map_err(|e| ReportError::read(path, e))?;
    serde_json::from_str(&text).map_err(|source| ReportError::Json { path: path.to_path_buf(), source })
}

fn read_json_opt<T: DeserializeOwned>(path: &Path) -> Result<Option<T>, ReportError> {
    if path.exists() { read_json(path).map(Some) } else { Ok(None) }
}

fn write_json<T: Serialize>(path: &Path, value: &T) -> Result<(), ReportError> {
    let mut json = serde_json::to_string(value).expect("plain data serialises");
    json.push('\n');
    write_file(path, json.as_bytes())
}

fn read_csv<T: DeserializeOwned>(path: &Path) -> Result<Vec<T>, ReportError> {
    let file = std::fs::File::open(path).map_err(|e| ReportError::read(path, e))?;
    let mut r = csv::Reader::from_reader(file);
    let mut rows = Vec::new();
    for row in r.deserialize() {
        rows.push(row.map_err(|e| ReportError::Csv { path: path.to_path_buf(), message: e.to_string() })?);
    }
    Ok(rows)
}

fn write_csv<T: Serialize>(path: &Path, rows: &[T]) -> Result<(), ReportError> {
    let mut w = csv::WriterBuilder::new().terminator(csv::Terminator::Any(b'\n')).from_writer(Vec::new());
    for row in rows {
        w.serialize(row).expect("plain data serialises to CSV");
    }
    let bytes = w.into_inner().expect("CSV into memory");
    write_file(path, &bytes)
}
