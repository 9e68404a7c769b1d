//! End-to-end tests of the report: Chrome traces, plots, the HTML page, the input
//! directory and its errors, determinism, and (with STRATA_BROWSER_TEST=1) a real browser.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde_json::Value;
use strata_models::plan::Stream;
use strata_reports::plots::gantt::GanttPlot;
use strata_reports::plots::landscape::LandscapePlot;
use strata_reports::plots::memory::MemoryPlot;
use strata_reports::plots::op_bars::OpBarsPlot;
use strata_reports::plots::step_time::StepTimePlot;
use strata_reports::plots::{Figure, render};
use strata_reports::{ReportError, build_report, chrome_trace_json, load_inputs, save_inputs};

/// A fresh, empty scratch directory for one test.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("strata-reports-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Every file under `dir`, relative path → bytes.
fn tree(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.insert(p.strip_prefix(dir).unwrap().to_path_buf(), std::fs::read(&p).unwrap());
            }
        }
    }
    out
}

#[test]
fn chrome_trace_has_one_process_per_rank_and_a_slice_per_span() {
    let c = support::comparison("t", support::plan(2, 2, 2, 1, "1f1b", 1, 4), 7);
    let plan = c.timelines.plan.as_ref().unwrap();
    let trace = c.timelines.measured_trace.as_ref().unwrap();
    let json = chrome_trace_json(plan, trace);
    assert_eq!(json, chrome_trace_json(plan, trace), "same input, same bytes");
    let v: Value = serde_json::from_str(&json).expect("valid JSON");
    let events = v["traceEvents"].as_array().unwrap();

    // One process per rank, named with the grid label.
    let names: BTreeMap<u64, String> = events
        .iter()
        .filter(|e| e["ph"] == "M" && e["name"] == "process_name")
        .map(|e| (e["pid"].as_u64().unwrap(), e["args"]["name"].as_str().unwrap().to_string()))
        .collect();
    assert_eq!(names.len(), 8);
    for r in 0..8u32 {
        assert_eq!(names[&(r as u64 + 1)], plan.grid.label(r));
    }
    let slices: Vec<&Value> = events.iter().filter(|e| e["ph"] == "X").collect();
    assert_eq!(slices.len(), trace.spans.len());
    let pids: BTreeSet<u64> = slices.iter().map(|e| e["pid"].as_u64().unwrap()).collect();
    assert_eq!(pids, (1..=8).collect());

    // Slice names and args as the plan has them: `attn fwd L<layer>` on the compute thread.
    let attn: Vec<&&Value> = slices.iter().filter(|e| e["name"].as_str().unwrap().starts_with("attn fwd L")).collect();
    assert!(!attn.is_empty());
    for e in &attn {
        assert_eq!(e["tid"], Stream::Compute.index() as u64 + 1);
        assert_eq!(e["cat"], "compute");
        let a = &e["args"];
        assert_eq!(a["piece"], "attn");
        assert_eq!(a["phase"], "fwd");
        assert!(a["flops"].as_u64().unwrap() > 0);
        for key in ["microbatch", "chunk", "layer", "bytes"] {
            assert!(a[key].is_u64(), "{key} in {a}");
        }
        assert_eq!(e["name"].as_str().unwrap(), format!("attn fwd L{}", a["layer"]));
    }
    assert!(slices.iter().any(|e| e["name"] == "all-reduce tp" && e["args"]["bytes"].as_u64().unwrap() > 0));

    // Microsecond timestamps keep every nanosecond: ts·1000 is the span's start.
    let starts: BTreeSet<u64> = trace.spans.iter().map(|s| s.start_ns).collect();
    for e in &slices {
        let ts = e["ts"].as_f64().unwrap();
        assert!(starts.contains(&((ts * 1000.0).round() as u64)));
    }
    // Every ts and dur is written as an exact decimal with three places.
    for key in ["\"ts\":", "\"dur\":"] {
        for part in json.split(key).skip(1) {
            let num: String = part.chars().take_while(|c| c.is_ascii_digit() || *c == '.').collect();
            let (int, frac) = num.split_once('.').unwrap_or_else(|| panic!("{key}{num}"));
            assert!(!int.is_empty() && frac.len() == 3, "{key}{num}");
        }
    }

    // Slices of one thread nest (the format's rule for complete events).
    let mut by_thread: BTreeMap<(u64, u64), Vec<(f64, f64)>> = BTreeMap::new();
    for e in &slices {
        let ts = e["ts"].as_f64().unwrap();
        by_thread
            .entry((e["pid"].as_u64().unwrap(), e["tid"].as_u64().unwrap()))
            .or_default()
            .push((ts, ts + e["dur"].as_f64().unwrap()));
    }
    for ((pid, tid), mut v) in by_thread {
        v.sort_by(|a, b| a.0.total_cmp(&b.0).then(b.1.total_cmp(&a.1)));
        let mut open: Vec<f64> = Vec::new();
        for (s, e) in v {
            while open.last().is_some_and(|&end| end <= s + 1e-9) {
                open.pop();
            }
            assert!(
                open.last().is_none_or(|&end| e <= end + 1e-9),
                "pid {pid} tid {tid}: [{s}, {e}] overlaps its parent"
            );
            open.push(e);
        }
    }

    // Memory as a counter track on every rank.
    let counters: BTreeSet<u64> =
        events.iter().filter(|e| e["ph"] == "C" && e["name"] == "memory").map(|e| e["pid"].as_u64().unwrap()).collect();
    assert_eq!(counters, (1..=8).collect());
}

/// Decodes a PNG and checks its size and that the plot area holds more than background.
fn check_png(path: &Path, size: (u32, u32)) {
    let img = image::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())).to_rgb8();
    assert_eq!(img.dimensions(), size, "{}", path.display());
    let (w, h) = size;
    let mut ink = 0usize;
    let mut colours = BTreeSet::new();
    for y in h / 5..h * 4 / 5 {
        for x in w / 5..w * 4 / 5 {
            let p = img.get_pixel(x, y).0;
            colours.insert(p);
            ink += usize::from(p != [255, 255, 255]);
        }
    }
    let area = (w * 3 / 5 * h * 3 / 5) as usize;
    assert!(ink * 100 > area, "{}: plot area is {ink}/{area} non-white", path.display());
    assert!(colours.len() >= 3, "{}: only {} colours", path.display(), colours.len());
    // Text: the caption band (top 8 %) has anti-aliased glyph pixels.
    let title_ink = (0..h * 8 / 100)
        .flat_map(|y| (0..w).map(move |x| (x, y)))
        .filter(|&(x, y)| img.get_pixel(x, y).0 != [255, 255, 255])
        .count();
    assert!(title_ink > 200, "{}: no title text ({title_ink} pixels)", path.display());
}

#[test]
fn every_plot_renders_png_and_svg_with_its_axis_labels() {
    let out = scratch("plots");
    let inputs = support::sample_inputs(3);
    let set = &inputs.comparisons;
    let p = &set.plans[0];
    let t = &p.timelines;
    let (plan, pred, meas) =
        (t.plan.as_ref().unwrap(), t.predicted_trace.as_ref().unwrap(), t.measured_trace.as_ref().unwrap());
    let gantt = GanttPlot::new("Timeline", plan, pred, meas);
    let lanes = strata_reports::plots::gantt::lane_labels(&gantt);
    assert!(lanes.contains(&"rank 0 · compute".to_string()) && lanes.contains(&"rank 4 · pp".to_string()), "{lanes:?}");
    let landscape = inputs.landscape.as_ref().unwrap();
    check_figure(
        &StepTimePlot::new(set),
        "step-time",
        &out,
        &["predicted step time (ms)", "measured step time, median (ms)", "±10% error band"],
    );
    check_figure(
        &OpBarsPlot::new(p),
        "ops",
        &out,
        &["time per rank per step", "attn fwd", "predicted (simulator)", "measured (runtime)"],
    );
    check_figure(
        &gantt,
        "timeline",
        &out,
        &["time since step start (ms)", "Simulated", "Measured", "rank 0 · compute", "forward"],
    );
    check_figure(
        &MemoryPlot::new(p),
        "memory",
        &out,
        &["allocated (", "rank 0", "predicted (solid)", "measured (dashed)"],
    );
    check_figure(
        &LandscapePlot::new(landscape),
        "landscape",
        &out,
        &["tensor-parallel size (tp)", "pipeline-parallel size (pp)", "tok/s", "OOM"],
    );
}

/// Renders a figure and checks both files: the SVG keeps its labels as text, the PNG has
/// the figure's size and ink in its plot area and caption.
fn check_figure(fig: &impl Figure, name: &str, dir: &Path, labels: &[&str]) {
    let r = render(fig, name, dir).unwrap();
    let svg = std::fs::read_to_string(&r.svg_path).unwrap();
    assert_eq!(svg, r.svg);
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"), "{name}");
    assert!(svg.matches("<text").count() >= 10, "{name}: few text elements");
    for l in labels {
        assert!(svg.contains(l), "{name}: SVG lacks {l:?}");
    }
    check_png(&r.png, fig.size());
}

#[test]
fn report_is_byte_identical_and_self_contained() {
    let (a, b) = (scratch("det-a"), scratch("det-b"));
    let inputs = support::sample_inputs(4);
    let fa = build_report(&inputs, &a).unwrap();
    build_report(&inputs, &b).unwrap();
    let (ta, tb) = (tree(&a), tree(&b));
    assert_eq!(ta.keys().collect::<Vec<_>>(), tb.keys().collect::<Vec<_>>());
    for (k, v) in &ta {
        assert!(v == &tb[k], "{} differs between two builds", k.display());
    }
    // 4 plans: step-time and landscape, and per plan ops, timeline and memory.
    assert_eq!(fa.png.len(), 2 + 3 * 4);
    assert_eq!(fa.svg.len(), fa.png.len());
    assert_eq!(fa.traces.len(), 2 * 4);
    let html = std::fs::read_to_string(&fa.html).unwrap();
    for id in &fa.html_tables {
        assert!(html.contains(&format!("id=\"table-{id}\"")), "table {id} missing from the page");
        assert!(a.join(format!("{id}.csv")).exists(), "table {id} has no CSV");
    }
    for id in ["summary", "step-time", "landscape"] {
        assert!(fa.html_tables.iter().any(|t| t == id), "{id}");
    }
    for p in &inputs.comparisons.plans {
        for t in ["ops", "timeline", "peak-memory"] {
            assert!(fa.html_tables.contains(&format!("{t}-{}", p.slug())), "{t} of {}", p.name);
        }
    }
    assert!(!html.to_ascii_lowercase().contains("http"), "the page names a URL");
    assert!(!html.contains("<script") && !html.contains("<img") && !html.contains("<link"));
    assert_eq!(html.matches("<svg").count(), 2 + 3 * 4);
    assert!(html.contains("@font-face") && html.contains("data:font/ttf;base64,"));
    // CSV behind the step-time plot: one row per plan, full precision.
    let csv = std::fs::read_to_string(a.join("step-time.csv")).unwrap();
    assert_eq!(csv.lines().count(), 1 + 4);
    assert!(csv.starts_with("#,plan,configuration,predicted_s,measured_median_s"));
}

#[test]
fn inputs_round_trip_through_a_directory() {
    let dir = scratch("roundtrip");
    let inputs = support::sample_inputs(2);
    save_inputs(&dir, &inputs).unwrap();
    let back = load_inputs(&dir).unwrap();
    for (a, b) in back.comparisons.plans.iter().zip(&inputs.comparisons.plans) {
        assert_eq!(a.without_timelines(), b.without_timelines());
        assert!(a.timelines.plan == b.timelines.plan, "plan of {}", a.name);
        assert!(a.timelines.predicted_trace == b.timelines.predicted_trace, "predicted trace of {}", a.name);
        assert!(a.timelines.measured_trace == b.timelines.measured_trace, "measured trace of {}", a.name);
    }
    assert_eq!(back.landscape, inputs.landscape);
    assert!(back == inputs);
    for f in
        ["comparisons.json", "landscape.csv", "plans/tp2-pp2-dp2/plan.json", "plans/tp1-pp2-dp4/measured-trace.json"]
    {
        assert!(dir.join(f).exists(), "{f}");
    }
    // The report from the directory equals the report from memory.
    let (a, b) = (scratch("roundtrip-a"), scratch("roundtrip-b"));
    build_report(&dir, &a).unwrap();
    build_report(&inputs, &b).unwrap();
    assert!(tree(&a) == tree(&b));
}

/// The error's message (without printing a large `Ok` value when there is none).
fn err_text<T>(r: Result<T, ReportError>) -> String {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn bad_inputs_are_errors_that_name_the_file() {
    let dir = scratch("bad");
    // Missing directory, then an empty one.
    let e = err_text(load_inputs(&dir.join("nope")));
    assert!(e.contains("nope") && e.contains("not found"), "{e}");
    let e = err_text(build_report(&dir, &dir.join("out")));
    assert!(e.contains("comparisons.json"), "{e}");

    // Malformed JSON.
    std::fs::write(dir.join("comparisons.json"), "{\"plans\": [ {\"name\": 3 } ]").unwrap();
    let e = err_text(load_inputs(&dir));
    assert!(e.contains("comparisons.json") && e.contains("malformed JSON"), "{e}");

    // Malformed CSV.
    let inputs = support::sample_inputs(1);
    save_inputs(&dir, &inputs).unwrap();
    std::fs::write(dir.join("landscape.csv"), "tp,pp,tokens_per_s,label\n2,two,1.0,x\n").unwrap();
    let e = err_text(load_inputs(&dir));
    assert!(e.contains("landscape.csv") && e.contains("malformed CSV"), "{e}");

    // Well-formed but wrong: a trace that belongs to another plan.
    save_inputs(&dir, &inputs).unwrap();
    let other = support::plan(1, 1, 8, 1, "1f1b", 0, 4);
    let json = serde_json::to_string(&other).unwrap();
    std::fs::write(dir.join("plans/tp2-pp2-dp2/plan.json"), json).unwrap();
    let e = err_text(load_inputs(&dir));
    assert!(e.contains("tp2-pp2-dp2") && e.contains("another comparison"), "{e}");
    // A trace whose spans name ops on the wrong streams.
    save_inputs(&dir, &inputs).unwrap();
    let mut trace = inputs.comparisons.plans[0].timelines.measured_trace.clone().unwrap();
    for s in &mut trace.spans {
        s.stream = Stream::Dp;
    }
    std::fs::write(dir.join("plans/tp2-pp2-dp2/measured-trace.json"), serde_json::to_string(&trace).unwrap()).unwrap();
    let e = err_text(load_inputs(&dir));
    assert!(e.contains("measured trace") && e.contains("another plan"), "{e}");

    // Non-positive step time, in memory.
    let mut bad = inputs.clone();
    bad.comparisons.plans[0].measured_steps_s = vec![];
    let e = err_text(build_report(&bad, &dir.join("out")));
    assert!(e.contains("measured_steps_s"), "{e}");
}

#[test]
fn report_of_a_search_alone() {
    let out = scratch("search-only");
    let mut inputs = support::sample_inputs(0);
    inputs.title = String::new();
    let files = build_report(&inputs, &out).unwrap();
    assert_eq!(files.png.len(), 1);
    let html = std::fs::read_to_string(&files.html).unwrap();
    assert!(html.contains("id=\"table-landscape\""));
    assert!(html.contains("Strata: predicted vs measured"));
}

/// Opens the report in headless Chromium (reports/tests/browser.sh): no console errors, a
/// screenshot that is not blank. Runs when STRATA_BROWSER_TEST=1 (CI installs chromium).
#[test]
fn report_opens_in_a_real_browser() {
    if std::env::var("STRATA_BROWSER_TEST").as_deref() != Ok("1") {
        eprintln!("skipped: set STRATA_BROWSER_TEST=1 (needs /usr/bin/chromium)");
        return;
    }
    let out = scratch("browser");
    let files = build_report(&support::sample_inputs(3), &out).unwrap();
    let shot = out.join("screenshot.png");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser.sh");
    let status = std::process::Command::new("bash").arg(script).arg(&files.html).arg(&shot).status().unwrap();
    assert!(status.success(), "browser check failed: {status}");
    check_png(&shot, (1280, 2000));
}
