//! The fuzz target: seeded mutations of the shipped scenarios and the corpus in
//! `tests/fuzz/corpus/` run in process through inspect / plan / verify / simulate (and a
//! sample of search), every outcome classified ([`run::Class`]). Nothing but **ok** and
//! **refused** may occur.
//!
//! - `fuzz_bounded_campaign` (CI, `cargo test --release`): 8,000 cases on two threads in
//!   about 40 s on two busy cores (400 in a debug build); a case still running after 60 s
//!   counts as a hang. `STRATA_FUZZ_CASES` and `STRATA_FUZZ_SEED` change the count and the
//!   seed.
//! - `fuzz_long_campaign` (ignored; `cargo xtask fuzz --minutes N` runs it): as many cases
//!   as fit in `STRATA_FUZZ_MINUTES`, heavy ones lowered and simulated too.
//!
//! A case's input follows from (seed, index) alone, so a failure printed with its index
//! is reproduced with `STRATA_FUZZ_SEED=… STRATA_FUZZ_FIRST=index STRATA_FUZZ_CASES=1`.

mod r#gen;
mod run;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use r#gen::Rng;
use run::{Budget, Class, Input};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The corpus: (name, text, is a plan).
fn corpus() -> Vec<(String, String, bool)> {
    let mut out = Vec::new();
    for dir in [root().join("scenarios"), root().join("tests/fuzz/corpus")] {
        let mut files: Vec<PathBuf> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
        files.sort();
        for f in files {
            let name = f.file_name().unwrap().to_string_lossy().into_owned();
            let text = std::fs::read_to_string(&f).unwrap();
            // Multi-job files are another format (`[[job]]` tables), loaded by
            // `scenario::jobs`; the campaign mutates scenarios and plans.
            if name.ends_with(".toml") && !strata_models::scenario::jobs::is_jobs_file(&text) {
                out.push((name, text, false));
            } else if name.ends_with(".json") {
                out.push((name, text, true));
            }
        }
    }
    assert!(out.len() >= 8, "the corpus is {} files", out.len());
    out
}

/// Large shipped scenarios: picked rarely, they dominate a campaign's time.
fn heavy(name: &str) -> bool {
    name.starts_with("gpt3-175b") || name.starts_with("llama3-405b") || name.starts_with("deepseek-v3")
}

struct Case {
    input: Input,
    label: String,
}

fn case(corpus: &[(String, String, bool)], plans: &[(serde_json::Value, Vec<String>)], seed: u64, i: u64) -> Case {
    let mut rng = Rng::new(seed ^ i.wrapping_mul(0xA076_1D64_78BD_642F));
    let light: Vec<usize> = (0..corpus.len()).filter(|&k| !heavy(&corpus[k].0)).collect();
    let k = if rng.chance(3) { rng.below(corpus.len() as u64) as usize } else { *rng.pick(&light) };
    let (name, text, is_plan) = &corpus[k];
    if *is_plan {
        let pi = corpus[..k].iter().filter(|c| c.2).count();
        let (value, paths) = &plans[pi];
        let mutated = r#gen::mutate_plan(&mut rng, value, paths);
        return Case { input: Input::Plan(mutated.to_string()), label: format!("{name} (mutated)") };
    }
    if rng.chance(12) {
        let t = r#gen::mutate_text(&mut rng, text);
        return Case {
            label: format!("{name} text-mutated ({} bytes)", t.len()),
            input: Input::Scenario { text: t, overrides: vec![], search: false },
        };
    }
    // One to four overrides, at most one of them extreme (and none in a third of cases).
    let n = 1 + rng.below(4);
    let extreme = if rng.chance(66) { rng.below(n) } else { n };
    let overrides: Vec<String> = (0..n).map(|j| r#gen::override_spec(&mut rng, j == extreme)).collect();
    let search = rng.chance(4);
    let shown: Vec<String> = overrides.iter().map(|o| o.chars().take(80).collect()).collect();
    Case {
        label: format!("{name} --set {}{}", shown.join(" --set "), if search { " (+search)" } else { "" }),
        input: Input::Scenario { text: text.clone(), overrides, search },
    }
}

struct Figures {
    cases: u64,
    lowered: u64,
    by_class: BTreeMap<Class, u64>,
    failures: Vec<String>,
    wall: Duration,
}

fn env_u64(key: &str) -> Option<u64> {
    std::env::var(key).ok().and_then(|v| v.parse().ok())
}

/// Runs cases `first..first + count` (or until `deadline`) on `threads` threads.
fn campaign(seed: u64, first: u64, count: u64, deadline: Option<Instant>, budget: Budget, threads: u64) -> Figures {
    let corpus = corpus();
    let plans: Vec<(serde_json::Value, Vec<String>)> = corpus
        .iter()
        .filter(|c| c.2)
        .map(|c| {
            let v: serde_json::Value = serde_json::from_str(&c.1).unwrap();
            let mut paths = Vec::new();
            r#gen::leaves(&v, String::new(), &mut paths);
            (v, paths)
        })
        .collect();
    let start = Instant::now();
    let next = AtomicU64::new(first);
    let stop = AtomicBool::new(false);
    let results: Mutex<Vec<(u64, Class, bool, String)>> = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                loop {
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= first + count || deadline.is_some_and(|d| Instant::now() >= d) {
                        stop.store(true, Ordering::Relaxed);
                        return;
                    }
                    let c = case(&corpus, &plans, seed, i);
                    let out = run::run(&c.input, budget);
                    let note = if out.class.failed() {
                        format!(
                            "case {i}: {:?}: {} — {}",
                            out.class,
                            c.label,
                            out.why.chars().take(300).collect::<String>()
                        )
                    } else {
                        String::new()
                    };
                    results.lock().unwrap().push((i, out.class, out.lowered, note));
                }
            });
        }
    });
    let mut results = results.into_inner().unwrap();
    results.sort_by_key(|r| r.0);
    let mut by_class = BTreeMap::new();
    for r in &results {
        *by_class.entry(r.1).or_insert(0) += 1;
    }
    Figures {
        cases: results.len() as u64,
        lowered: results.iter().filter(|r| r.2).count() as u64,
        by_class,
        failures: results.into_iter().filter(|r| r.1.failed()).map(|r| r.3).collect(),
        wall: start.elapsed(),
    }
}

fn report(name: &str, seed: u64, f: &Figures) {
    let count = |c: Class| f.by_class.get(&c).copied().unwrap_or(0);
    eprintln!(
        "{name} (seed {seed}): {} cases in {:.1} s ({} lowered and simulated) — ok {}, refused {}; panics {}, hangs {}, nonsense {}, internal {}, long messages {} (aborts 0: the process survived)",
        f.cases,
        f.wall.as_secs_f64(),
        f.lowered,
        count(Class::Ok),
        count(Class::Refused),
        count(Class::Panic),
        count(Class::Hang),
        count(Class::Nonsense),
        count(Class::Internal),
        count(Class::LongMessage),
    );
    for line in f.failures.iter().take(40) {
        eprintln!("  {line}");
    }
}

/// Silences the default panic message of caught panics (they are counted and listed, with
/// the panic's location).
fn quiet_panics() {
    std::panic::set_hook(Box::new(|info| {
        let at = info.location().map(|l| format!("{}:{}", l.file(), l.line())).unwrap_or_default();
        run::PANIC_AT.with(|p| *p.borrow_mut() = at);
    }));
}

#[test]
fn fuzz_bounded_campaign() {
    let seed = env_u64("STRATA_FUZZ_SEED").unwrap_or(14);
    let count = env_u64("STRATA_FUZZ_CASES").unwrap_or(if cfg!(debug_assertions) { 400 } else { 8000 });
    let first = env_u64("STRATA_FUZZ_FIRST").unwrap_or(0);
    // A hang is a case that does not finish, not a slow one: the limit leaves room for a
    // loaded 2-core CI machine (the heaviest bounded case takes a few seconds there). How
    // fast the campaign runs is a benchmark's business, not this test's.
    let budget = Budget { max_layer_passes: 2048, hang: Duration::from_secs(60) };
    quiet_panics();
    let f = campaign(seed, first, count, None, budget, 2);
    report("bounded fuzz campaign", seed, &f);
    assert_eq!(f.cases, count);
    assert!(f.failures.is_empty(), "{} of {} fuzz cases failed (listed above)", f.failures.len(), f.cases);
}

#[test]
#[ignore = "long campaign: cargo xtask fuzz --minutes N"]
fn fuzz_long_campaign() {
    let minutes = env_u64("STRATA_FUZZ_MINUTES").unwrap_or(10);
    let seed = env_u64("STRATA_FUZZ_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_secs())
    });
    let threads = env_u64("STRATA_FUZZ_THREADS").unwrap_or(2);
    // Cases up to the work budget run four commands' work (plan, the JSON round trip and
    // check, verify, simulate): 30 s on a loaded 2-core machine.
    let budget = Budget { max_layer_passes: u64::MAX, hang: Duration::from_secs(30) };
    quiet_panics();
    let deadline = Instant::now() + Duration::from_secs(minutes * 60);
    let f = campaign(seed, 0, u64::MAX / 2, Some(deadline), budget, threads);
    report(&format!("long fuzz campaign, {minutes} min"), seed, &f);
    assert!(f.failures.is_empty(), "{} of {} fuzz cases failed (listed above)", f.failures.len(), f.cases);
}

/// Every corpus file is valid as it stands, so mutations start from working inputs.
#[test]
fn the_corpus_is_valid() {
    for (name, text, is_plan) in corpus() {
        if is_plan {
            let plan: strata_models::plan::Plan = serde_json::from_str(&text).unwrap();
            strata_models::plan::check::CheckedPlan::new(plan).unwrap_or_else(|e| panic!("{name}: {e}"));
        } else {
            strata_models::Scenario::from_toml(&text, &name, "fuzz", &[]).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
    }
}
