//! The configuration search: exhaustive where it claims to be, deterministic across thread
//! counts, honest when nothing fits, and never worse than a published configuration.

use strata_models::Scenario;
use strata_sim::search::{SearchOptions, SearchSpace, search};

fn scenario(text: &str) -> Scenario {
    Scenario::from_toml(text, "test", "test", &[]).unwrap_or_else(|e| panic!("{e}"))
}

fn small_h100() -> Scenario {
    scenario(
        r#"
[model]
preset = "gpt2-350m"
vocab = 50304
[cluster]
preset = "dgx-h100"
nodes = 2
[parallel]
tp = 2
pp = 2
global_batch = 64
"#,
    )
}

fn quiet(_: strata_sim::search::Progress, _: u64, _: u64) {}

/// A narrow space: every dimension but the overlap knobs, few values each.
fn narrow(base: &Scenario) -> SearchSpace {
    let mut space = SearchSpace::splits(base);
    space.micro_batch = vec![1, 4];
    space.vpp = vec![2];
    space
}

#[test]
fn multi_fidelity_finds_the_exhaustive_winner() {
    for base in [small_h100(), scenario(include_str!("../../scenarios/tiny-gpt-cpu.toml"))] {
        let mut opts = SearchOptions::new(&base);
        opts.space = narrow(&base);
        opts.exhaustive = true;
        let all = search(&base, &opts, &quiet).unwrap();
        opts.exhaustive = false;
        opts.simulate_top = 8;
        let screened = search(&base, &opts, &quiet).unwrap();
        assert!(all.simulated > screened.simulated, "{} vs {}", all.simulated, screened.simulated);
        let (a, b) = (all.best().unwrap(), screened.best().unwrap());
        assert_eq!(
            a.label,
            b.label,
            "exhaustive winner {} ({:.1} tok/s) vs screened {} ({:.1})",
            a.label,
            a.tokens_per_s().unwrap(),
            b.label,
            b.tokens_per_s().unwrap()
        );
    }
}

#[test]
fn ranking_is_the_same_on_one_and_two_threads() {
    let base = small_h100();
    let mut opts = SearchOptions::new(&base);
    opts.space = narrow(&base);
    opts.simulate_top = 12;
    let run = |threads| {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        pool.install(|| search(&base, &opts, &quiet).unwrap())
    };
    let (one, two) = (run(1), run(2));
    let labels = |r: &strata_sim::search::SearchResult| {
        r.ranking
            .iter()
            .map(|i| (r.candidates[*i].label.clone(), r.candidates[*i].tokens_per_s().unwrap().to_bits()))
            .collect::<Vec<_>>()
    };
    assert_eq!(labels(&one), labels(&two));
    assert!(one.ranking.len() >= 12);
}

#[test]
fn an_infeasible_request_names_the_smallest_shortfall() {
    // Llama 3 405B on one DGX A100 node cannot fit at any split.
    let base = scenario(
        "[model]\npreset = \"llama3-405b\"\n[cluster]\npreset = \"dgx-a100\"\n[parallel]\ntp = 8\nglobal_batch = 8\n",
    );
    let mut opts = SearchOptions::new(&base);
    opts.space = narrow(&base);
    let r = search(&base, &opts, &quiet).unwrap();
    assert!(r.ranking.is_empty());
    let s = r.infeasible.expect("a shortfall");
    assert!(s.needed_bytes > s.available_bytes, "{s:?}");
    // No candidate needs less.
    let min = r.candidates.iter().map(|c| c.memory_estimate_bytes).fold(f64::INFINITY, f64::min);
    assert!(s.needed_bytes <= min * 1.0001, "{} vs {min}", s.needed_bytes);
}
