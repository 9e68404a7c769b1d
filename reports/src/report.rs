//! `strata report DIR`: inputs in, a folder of files out.
//!
//! ```text
//! OUT/report.html                    the self-contained page
//! OUT/<table>.csv                    the numbers behind every plot (summary, step-time,
//!                                    landscape, ops-<plan>, timeline-<plan>,
//!                                    timeline-<plan>-spans, peak-memory-<plan>, memory-<plan>)
//! OUT/plots/<plot>.png, .svg         step-time, landscape, ops-<plan>, timeline-<plan>, memory-<plan>
//! OUT/traces/<plan>-predicted.json   Chrome / Perfetto traces
//! OUT/traces/<plan>-measured.json
//! ```
//!
//! Every file is a pure function of the inputs (no time stamps, fixed float formatting,
//! fixed order), so building twice gives byte-identical folders.

use std::path::{Path, PathBuf};

use strata_models::plan::Plan;
use strata_models::trace::Trace;

use crate::accuracy::{Accuracy, accuracy};
use crate::chrome_trace::chrome_trace_json;
use crate::error::{ReportError, write_file};
use crate::html::{Block, Section, page};
use crate::input_dir::load_inputs;
use crate::inputs::{PlanComparison, ReportInputs};
use crate::plots::gantt::{self, GanttPlot};
use crate::plots::landscape::{self, LandscapePlot};
use crate::plots::memory::{self, MemoryPlot};
use crate::plots::op_bars::{self, OpBarsPlot};
use crate::plots::step_time::{self, StepTimePlot};
use crate::plots::{Figure, render};
use crate::table::{Cell, Table};

/// Where the inputs come from.
pub enum ReportSource<'a> {
    /// A directory in the layout of [`crate::input_dir`].
    Dir(&'a Path),
    /// Inputs already in memory.
    Inputs(&'a ReportInputs),
}

impl<'a> From<&'a Path> for ReportSource<'a> {
    fn from(p: &'a Path) -> Self {
        ReportSource::Dir(p)
    }
}
impl<'a> From<&'a PathBuf> for ReportSource<'a> {
    fn from(p: &'a PathBuf) -> Self {
        ReportSource::Dir(p)
    }
}
impl<'a> From<&'a ReportInputs> for ReportSource<'a> {
    fn from(i: &'a ReportInputs) -> Self {
        ReportSource::Inputs(i)
    }
}

/// What a report build wrote.
#[derive(Clone, Debug)]
pub struct ReportFiles {
    pub html: PathBuf,
    /// Every table, as CSV.
    pub csv: Vec<PathBuf>,
    pub png: Vec<PathBuf>,
    pub svg: Vec<PathBuf>,
    /// Chrome / Perfetto trace JSON.
    pub traces: Vec<PathBuf>,
    /// Ids of the tables shown in the HTML page (`table-<id>` there).
    pub html_tables: Vec<String>,
    pub accuracy: Accuracy,
}

/// Builds the report into `out_dir` (created if needed).
pub fn build_report<'a>(source: impl Into<ReportSource<'a>>, out_dir: &Path) -> Result<ReportFiles, ReportError> {
    let loaded;
    let inputs = match source.into() {
        ReportSource::Dir(dir) => {
            loaded = load_inputs(dir)?;
            &loaded
        }
        ReportSource::Inputs(i) => {
            i.validate("report inputs")?;
            i
        }
    };
    let plans = &inputs.comparisons.plans;
    let landscape = inputs.landscape.as_ref().filter(|l| !l.cells.is_empty());
    if plans.is_empty() && landscape.is_none() {
        return Err(ReportError::invalid("report inputs", "no plans and no search landscape: nothing to report"));
    }
    let mut b = Builder {
        out: out_dir.to_path_buf(),
        files: ReportFiles {
            html: out_dir.join("report.html"),
            csv: Vec::new(),
            png: Vec::new(),
            svg: Vec::new(),
            traces: Vec::new(),
            html_tables: Vec::new(),
            accuracy: accuracy(&inputs.comparisons),
        },
    };
    let mut sections = Vec::new();
    if !plans.is_empty() {
        sections.push(b.step_time_section(inputs)?);
    }
    if let Some(l) = landscape {
        let plot = LandscapePlot::new(l);
        let svg = b.plot(&plot, "landscape")?;
        sections.push(Section {
            id: "landscape".into(),
            title: "Search landscape".into(),
            intro: "The best throughput the search found at each tensor- and pipeline-parallel size \
                    (over data-parallel size, schedule, micro-batch, ZeRO stage and recomputation)."
                .into(),
            blocks: vec![b.block(
                svg,
                "Colour: simulated tokens/s; × marks out-of-memory or invalid cells.",
                vec![landscape::table(l)],
                vec![],
            )?],
        });
    }
    for p in plans {
        sections.push(b.plan_section(p)?);
    }
    let summary = summary_table(&b.files.accuracy, inputs);
    b.table(&summary, true)?;
    let title = if inputs.title.is_empty() { "Strata: predicted vs measured" } else { &inputs.title };
    let lead = format!(
        "{} plan(s) run both in the simulator and for real{}. Times are seconds per training step unless marked; \
         memory is bytes per rank.",
        plans.len(),
        if landscape.is_some() { ", and the search landscape" } else { "" }
    );
    let html = page(title, &lead, &summary, &sections);
    write_file(&b.files.html, html.as_bytes())?;
    Ok(b.files)
}

struct Builder {
    out: PathBuf,
    files: ReportFiles,
}

impl Builder {
    fn plot(&mut self, fig: &impl Figure, name: &str) -> Result<String, ReportError> {
        let r = render(fig, name, &self.out.join("plots"))?;
        self.files.png.push(r.png);
        self.files.svg.push(r.svg_path);
        Ok(r.svg)
    }

    fn table(&mut self, t: &Table, in_html: bool) -> Result<(), ReportError> {
        self.files.csv.push(t.write_csv(&self.out)?);
        if in_html {
            self.files.html_tables.push(t.id.clone());
        }
        Ok(())
    }

    /// A block whose tables all appear in the page (and as CSV).
    fn block(
        &mut self,
        svg: String,
        caption: &str,
        tables: Vec<Table>,
        links: Vec<(String, String)>,
    ) -> Result<Block, ReportError> {
        for t in &tables {
            self.table(t, true)?;
        }
        Ok(Block { svg, caption: caption.to_string(), tables, links })
    }

    fn step_time_section(&mut self, inputs: &ReportInputs) -> Result<Section, ReportError> {
        let set = &inputs.comparisons;
        let svg = self.plot(&StepTimePlot::new(set), "step-time")?;
        Ok(Section {
            id: "step-time".into(),
            title: "Step time across plans".into(),
            intro: format!(
                "Each point is one plan: the simulator's step time against the median measured step. \
                 Inside the shaded band the prediction is within {:.0}% of the measurement.",
                step_time::BAND * 100.0
            ),
            blocks: vec![self.block(
                svg,
                "Numbers label the points; the key on the right names the plans and their errors.",
                vec![step_time::table(set)],
                vec![],
            )?],
        })
    }

    fn plan_section(&mut self, p: &PlanComparison) -> Result<Section, ReportError> {
        let slug = p.slug();
        let mut blocks = Vec::new();
        let ops = OpBarsPlot::new(p);
        if !ops.is_empty() {
            let svg = self.plot(&ops, &format!("ops-{slug}"))?;
            blocks.push(self.block(
                svg,
                "Mean time per rank per step in each kind of op; communication includes waiting for peers.",
                vec![op_bars::table(p)],
                vec![],
            )?);
        }
        let t = &p.timelines;
        let mut links = Vec::new();
        if let Some(plan) = &t.plan {
            for (which, trace) in [("predicted", &t.predicted_trace), ("measured", &t.measured_trace)] {
                if let Some(trace) = trace {
                    links.push(self.chrome_trace(plan, trace, &format!("{slug}-{which}"))?);
                }
            }
        }
        if let (Some(plan), Some(pred), Some(meas)) = (&t.plan, &t.predicted_trace, &t.measured_trace) {
            blocks.push(self.timeline_block(p, plan, pred, meas, links)?);
        } else if !links.is_empty() {
            blocks.push(Block { svg: String::new(), caption: "Timelines:".into(), tables: vec![], links });
        }
        let mem = MemoryPlot::new(p);
        let peaks = memory::peak_table(p);
        if !mem.is_empty() {
            let svg = self.plot(&mem, &format!("memory-{slug}"))?;
            let samples = memory::samples_table(p);
            self.table(&samples, false)?;
            let link = (format!("{}.csv", samples.id), "every memory sample, predicted and measured".to_string());
            blocks.push(self.block(
                svg,
                "Allocated bytes per rank; solid lines are predicted, dashed are measured.",
                vec![peaks],
                vec![link],
            )?);
        } else if !peaks.rows.is_empty() {
            blocks.push(self.block(String::new(), "", vec![peaks], vec![])?);
        }
        Ok(Section { id: format!("plan-{slug}"), title: format!("Plan {}", p.name), intro: plan_intro(p), blocks })
    }

    fn timeline_block(
        &mut self,
        p: &PlanComparison,
        plan: &Plan,
        pred: &Trace,
        meas: &Trace,
        mut links: Vec<(String, String)>,
    ) -> Result<Block, ReportError> {
        let slug = p.slug();
        let title = format!("Timeline of one step: {} ({})", p.name, p.scenario.short());
        let plot = GanttPlot::new(&title, plan, pred, meas);
        let svg = if plot.is_empty() { String::new() } else { self.plot(&plot, &format!("timeline-{slug}"))? };
        let summary = gantt::summary_table(
            &format!("timeline-{slug}"),
            &format!("Busy time per rank and stream, {}", p.name),
            plan,
            pred,
            meas,
        );
        let spans = gantt::spans_table(&format!("timeline-{slug}-spans"), plan, pred, meas);
        self.table(&spans, false)?;
        links.insert(0, (format!("{}.csv", spans.id), "every span of both timelines".to_string()));
        let shown = gantt::shown_ranks(pred, meas);
        let caption = format!(
            "Simulated above, measured below, on the same time axis; ranks shown: {}. Open the traces in \
             ui.perfetto.dev or chrome://tracing for every op.",
            shown.iter().map(|r| r.to_string()).collect::<Vec<_>>().join(", ")
        );
        self.block(svg, &caption, vec![summary], links)
    }

    fn chrome_trace(&mut self, plan: &Plan, trace: &Trace, name: &str) -> Result<(String, String), ReportError> {
        let rel = format!("traces/{name}.json");
        let path = self.out.join(&rel);
        write_file(&path, chrome_trace_json(plan, trace).as_bytes())?;
        self.files.traces.push(path);
        Ok((rel, "Chrome / Perfetto trace".to_string()))
    }
}

fn seconds(s: f64) -> String {
    let (mul, unit) = crate::plots::time_unit(s);
    format!("{} {unit}", crate::table::sig(s * mul, 4))
}

fn plan_intro(p: &PlanComparison) -> String {
    let s = &p.scenario;
    format!(
        "{} on {}: {} ranks = tp {} × pp {} × dp {}; schedule {}, vpp {}, micro-batch {}, global batch {}, \
         ZeRO-{}, recompute {}, sequence parallel {}. Predicted step {}, measured {} (median of {} steps), \
         error {}.",
        s.model,
        s.cluster,
        s.ranks,
        s.tp,
        s.pp,
        s.dp,
        s.schedule,
        s.vpp,
        s.micro_batch,
        s.global_batch,
        s.zero,
        s.recompute,
        if s.sequence_parallel { "on" } else { "off" },
        seconds(p.predicted_step_s),
        seconds(p.measured_step_s()),
        p.measured_steps_s.len(),
        crate::plots::pct(p.step_error()),
    )
}

fn summary_table(a: &Accuracy, inputs: &ReportInputs) -> Table {
    let mut t = Table::new("summary", "Summary", &["figure", "value"]);
    let pct = |x: f64| Cell::Text(format!("{}%", crate::table::sig(100.0 * x, 3)));
    t.push(vec!["plans compared".into(), a.plans.to_string().into()]);
    if a.plans > 0 {
        t.push(vec!["median |step-time error|".into(), pct(a.median_abs_step_error)]);
        t.push(vec!["worst |step-time error|".into(), pct(a.max_abs_step_error)]);
        let tau = a.kendall_tau.map_or(Cell::Empty, |v| Cell::Text(format!("{v:.3}")));
        t.push(vec!["Kendall τ (predicted vs measured ranking)".into(), tau]);
        t.push(vec!["worst |peak-memory error|".into(), a.max_abs_peak_memory_error.map_or(Cell::Empty, pct)]);
        let plans = &inputs.comparisons.plans;
        let best = |f: &dyn Fn(&PlanComparison) -> f64| {
            plans.iter().min_by(|x, y| f(x).total_cmp(&f(y))).map(|p| p.name.clone()).unwrap_or_default()
        };
        t.push(vec!["fastest plan, predicted".into(), best(&|p| p.predicted_step_s).into()]);
        t.push(vec!["fastest plan, measured".into(), best(&|p| p.measured_step_s()).into()]);
    }
    if let Some(l) = &inputs.landscape {
        let ok = l.cells.iter().filter(|c| c.tokens_per_s.is_some()).count();
        t.push(vec!["landscape cells (feasible / all)".into(), format!("{ok} / {}", l.cells.len()).into()]);
    }
    t
}
