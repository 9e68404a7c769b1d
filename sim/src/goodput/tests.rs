//! The Monte Carlo against Daly's closed form, its accounts, and its determinism.

use strata_models::faults::failures::{Cause, Distribution, Process};

use super::closed::{daly_tau_s, discrete_wall_s};
use super::stream::FailureStream;
use super::trial::{self, SaveNs, TrialSpec};
use super::{Inputs, McOptions, Restart, Save, monte_carlo};

const DAY: f64 = 86_400.0;

/// A job that fails as one exponential process of mean `m_s`, with constant costs.
fn constant(m_s: f64, delta_s: f64, r_s: f64, dist: Distribution, units: u64) -> Inputs {
    let shape = 1.0;
    Inputs {
        gpus: 1024,
        nodes: 128,
        step_s: 1.0,
        work_s: 30.0 * DAY,
        checkpoint_bytes: 0.0,
        shard_bytes_max: 0.0,
        save: Save::Sync { block_s: delta_s },
        restart: Restart { detect_s: r_s, reschedule_s: 0.0, init_s: 0.0, load_s: 0.0 },
        processes: vec![Process {
            cause: Cause::Job,
            units,
            mtbf_hours: m_s * units as f64 / 3600.0,
            distribution: dist,
            shape,
        }],
        scenario_interval_s: None,
    }
}

fn sweep(tau_s: f64) -> Vec<u64> {
    (0..17).map(|i| (tau_s * 2f64.powf((i as f64 - 8.0) / 4.0)).round() as u64).collect()
}

#[test]
fn monte_carlo_agrees_with_daly() {
    // Exponential failures and constant costs: Daly's wall time is exact for this process,
    // so every interval's mean lies within the Monte Carlo's own error of it, and the best
    // interval the Monte Carlo finds is as good as Daly's by Daly's own measure.
    for (m_h, delta, r) in [(3.0, 60.0, 600.0), (1.0, 10.0, 300.0), (10.0, 300.0, 600.0)] {
        let m = m_h * 3600.0;
        let inp = constant(m, delta, r, Distribution::Exponential, 1);
        let tau = daly_tau_s(delta, m);
        let opts = McOptions { trials: 400, seed: 7, intervals_steps: sweep(tau) };
        let res = monte_carlo(&inp, &opts, &|_| {});
        for iv in &res.intervals {
            let want = discrete_wall_s(inp.work_s, iv.interval_s, delta, r, m);
            let sigma = iv.ci95_wall_s / 1.96;
            assert!(
                (iv.mean_wall_s - want).abs() < 4.0 * sigma,
                "M {m_h} h δ {delta}: τ {} MC {} ± {} vs Daly {want}",
                iv.interval_s,
                iv.mean_wall_s,
                iv.ci95_wall_s
            );
            assert_eq!(iv.unfinished, 0);
        }
        let best = res.best();
        // The optimum is flat: what matters is that the interval found costs (by Daly's
        // exact measure) no more than 0.3 points of goodput against Daly's interval…
        assert!(res.daly_efficiency - best.daly_efficiency < 3e-3, "M {m_h} δ {delta}: {best:?}");
        // … and that the Monte Carlo's goodput at its best is Daly's optimum within its CI.
        assert!(
            best.goodput_lo - 1e-3 <= res.daly_efficiency && res.daly_efficiency <= best.goodput_hi + 2e-3,
            "M {m_h} δ {delta}: MC {} [{}, {}] Daly {}",
            best.goodput,
            best.goodput_lo,
            best.goodput_hi,
            res.daly_efficiency
        );
        assert!(best.interval_s > 0.5 * tau && best.interval_s < 2.0 * tau, "τ_MC {} τ_Daly {tau}", best.interval_s);
    }
}

#[test]
fn weibull_of_shape_one_is_exponential() {
    // The same MTBF drawn per unit as Weibull(k = 1) renewal processes and as one pooled
    // Poisson stream: different code, different draws, the same law.
    let m = 3.0 * 3600.0;
    let exp = constant(m, 60.0, 600.0, Distribution::Exponential, 64);
    let wei = constant(m, 60.0, 600.0, Distribution::Weibull, 64);
    let opts = McOptions { trials: 400, seed: 3, intervals_steps: vec![1200, 3600] };
    let (a, b) = (monte_carlo(&exp, &opts, &|_| {}), monte_carlo(&wei, &opts, &|_| {}));
    for (x, y) in a.intervals.iter().zip(&b.intervals) {
        let sigma = ((x.ci95_wall_s / 1.96).powi(2) + (y.ci95_wall_s / 1.96).powi(2)).sqrt();
        assert!((x.mean_wall_s - y.mean_wall_s).abs() < 4.0 * sigma, "{x:?}\n{y:?}");
        assert!((x.losses[0].failures - y.losses[0].failures).abs() < 0.05 * x.losses[0].failures);
    }
    // A shape below 1 with the same mean (new units fail early) is a different law.
    let mut infant = wei.clone();
    infant.processes[0].shape = 0.5;
    let c = monte_carlo(&infant, &opts, &|_| {});
    assert!(c.intervals[0].losses[0].failures > 1.2 * a.intervals[0].losses[0].failures);
}

#[test]
fn same_seed_same_figures_on_any_thread_count() {
    let inp = constant(3600.0, 30.0, 300.0, Distribution::Exponential, 1);
    let opts = McOptions { trials: 64, seed: 11, intervals_steps: vec![300, 900] };
    let on = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        pool.install(|| monte_carlo(&inp, &opts, &|_| {}))
    };
    let one = on(1);
    assert_eq!(one, on(2));
    assert_eq!(one, on(3));
    let other = monte_carlo(&inp, &McOptions { seed: 12, ..opts.clone() }, &|_| {});
    assert_ne!(one.intervals[0].mean_wall_s, other.intervals[0].mean_wall_s);
}

fn spec(interval_ns: u64, save: SaveNs) -> TrialSpec {
    let work_ns = 10 * 86_400 * 1_000_000_000;
    TrialSpec { work_ns, interval_ns, save, restart_ns: 300_000_000_000, wall_cap_ns: u64::MAX, failure_cap: 1 << 20 }
}

fn procs(m_h: f64) -> Vec<Process> {
    vec![Process { cause: Cause::Gpu, units: 1, mtbf_hours: m_h, distribution: Distribution::Exponential, shape: 1.0 }]
}

#[test]
fn every_nanosecond_is_accounted_for() {
    for seed in 0..50 {
        for save in [
            SaveNs::Sync { block_ns: 60_000_000_000 },
            SaveNs::Async { block_ns: 1_000_000_000, write_ns: 900_000_000_000 },
        ] {
            let mut s = FailureStream::new(&procs(2.0), seed);
            let o = trial::run(spec(1_800_000_000_000, save), &mut s);
            assert!(!o.unfinished);
            assert_eq!(o.kept_ns, spec(1, save).work_ns);
            assert_eq!(o.accounts_ns(), o.wall_ns, "seed {seed} {save:?}: {o:?}");
            assert_eq!(o.failures[0] as usize, s.drawn() - 1, "every failure before the end is counted");
        }
    }
}

#[test]
fn async_save_with_an_instant_write_is_a_sync_save() {
    // Durable when its block ends either way: the two must be the same trial exactly.
    for seed in 0..20 {
        let run = |save| trial::run(spec(3_600_000_000_000, save), &mut FailureStream::new(&procs(3.0), seed));
        let sync = run(SaveNs::Sync { block_ns: 5_000_000_000 });
        let async_ = run(SaveNs::Async { block_ns: 5_000_000_000, write_ns: 0 });
        assert_eq!(sync, async_);
        // A slow background write leaves the last checkpoint behind: more work lost.
        let slow = run(SaveNs::Async { block_ns: 5_000_000_000, write_ns: 3_000_000_000_000 });
        assert!(slow.lost_ns[0] >= sync.lost_ns[0]);
    }
}

#[test]
fn without_failures_the_wall_time_is_work_plus_saves() {
    let s = spec(3_600_000_000_000, SaveNs::Sync { block_ns: 7_000_000_000 });
    let o = trial::run(s, &mut FailureStream::new(&[], 0));
    let saves = s.work_ns.div_ceil(s.interval_ns) - 1;
    assert_eq!(o.wall_ns, s.work_ns + saves * 7_000_000_000);
    assert_eq!(o.checkpoints as u64, saves);
}

#[test]
fn a_checkpoint_holds_the_states_a_framework_saves() {
    use strata_models::Scenario;
    use strata_models::accounting::params::total_params;
    let load = |text: &str| Scenario::from_toml(text, "t", "t", &[]).unwrap();
    // torchtitan keeps fp32 parameters and Adam: 12 B per parameter.
    let llama = load(include_str!("../../../scenarios/llama3-405b-16384xh100.toml"));
    let (bytes, shard) = super::checkpoint_bytes(&llama);
    let psi = total_params(&llama.model) as f64;
    assert!((bytes / psi - 12.0).abs() < 0.01, "{} B/param", bytes / psi);
    assert!(shard >= bytes / 16_384.0 && shard < 1.2 * bytes / 16_384.0);
    // Strata's layout (the ZeRO paper's, as Megatron-LM and DeepSpeed save theirs): 16-bit
    // weights + fp32 master + Adam, 14 B (BLOOM's 2.3 TB for 176B); a pipeline's tied
    // output layer is a second copy, saved by the last stage.
    let gpt = load(include_str!("../../../scenarios/gpt3-175b-1024xa100.toml"));
    let (bytes, _) = super::checkpoint_bytes(&gpt);
    let psi = total_params(&gpt.model) as f64;
    assert!((bytes / psi - 14.0).abs() < 0.1, "{} B/param", bytes / psi);
}
