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

/// Korthikanti et al. 2022's four configurations (tp 8, SP + selective recomputation) as
/// scenarios: the search must find a split at least as fast as the published one, under the
/// same model of the cluster.
#[test]
fn never_worse_than_the_published_korthikanti_configurations() {
    for (preset, pp, gb, mb, sched) in [
        ("gpt-22b", 1, 4, 4, "schedule = \"1f1b\""),
        ("gpt3-175b", 8, 64, 1, "schedule = \"interleaved\"\nvpp = 3"),
        ("gpt-530b", 35, 280, 1, "schedule = \"interleaved\"\nvpp = 3"),
        ("gpt-1t", 64, 512, 1, "schedule = \"1f1b\""),
    ] {
        let base = scenario(&format!(
            "[model]\npreset = \"{preset}\"\n[cluster]\npreset = \"dgx-a100\"\nnodes = {pp}\n[parallel]\ntp = 8\npp = {pp}\ndp = 1\n{sched}\nmicro_batch = {mb}\nglobal_batch = {gb}\nrecompute = \"selective\"\nsequence_parallel = true\n"
        ));
        let mut opts = SearchOptions::new(&base);
        opts.space = SearchSpace::splits(&base);
        opts.space.vpp = vec![base.parallel.vpp.max(2), 4];
        opts.simulate_top = 6;
        let r = search(&base, &opts, &quiet).unwrap();
        let published = &r.candidates[r.base.expect("the published split is in the space")];
        let published_tps = published.tokens_per_s().expect("the published split is simulated and fits");
        let best = r.best().unwrap();
        assert!(
            best.tokens_per_s().unwrap() >= published_tps,
            "{preset}: {} < published {published_tps}",
            best.tokens_per_s().unwrap()
        );
        println!(
            "{preset}: best {} at {:.0} tok/s vs published {} at {published_tps:.0} (+{:.1}%)",
            best.label,
            best.tokens_per_s().unwrap(),
            published.label,
            100.0 * (best.tokens_per_s().unwrap() / published_tps - 1.0)
        );
    }
}
