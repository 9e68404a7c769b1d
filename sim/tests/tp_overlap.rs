//! `parallel.tp_comm_overlap` (Megatron-LM's `--tp-comm-overlap`) in the simulator: the
//! overlapped sequence-parallel collectives cost what their GEMM leaves exposed, the
//! compute stays, the unset default follows the framework and GPU generation, and the
//! search estimate moves the same way as the simulation.

use strata_models::Scenario;
use strata_models::plan::lower;
use strata_sim::compute::ComputeModel;
use strata_sim::profile::HardwareProfile;
use strata_sim::search::estimate::Estimator;
use strata_sim::{SimOptions, SimReport, simulate};

/// GPT-32B's layer shapes (the Megatron-LM README's weak-scaling row), cut to 4 layers, on
/// one DGX H100 at tp 8 with sequence parallelism.
fn scenario(gpu_preset: &str, overlap: Option<bool>) -> Scenario {
    let overlap = overlap.map_or(String::new(), |o| format!("tp_comm_overlap = {o}\n"));
    let text = format!(
        "[model]\npreset = \"gpt3-175b\"\nlayers = 4\nhidden = 7168\nheads = 56\nkv_heads = 56\nffn_hidden = 28672\n\
         vocab = 131072\nseq_len = 4096\n[cluster]\npreset = \"{gpu_preset}\"\nnodes = 1\n\
         [parallel]\ntp = 8\npp = 1\ndp = 1\nglobal_batch = 4\nmicro_batch = 1\nzero = 1\nrecompute = \"none\"\n\
         sequence_parallel = true\n{overlap}[training]\ndtype = \"bf16\"\nframework = \"megatron\"\n"
    );
    Scenario::from_toml(&text, "test", "test", &[]).unwrap_or_else(|e| panic!("{e}"))
}

fn run(s: &Scenario) -> SimReport {
    simulate(&lower(s).unwrap(), &SimOptions::default()).unwrap()
}

#[test]
fn overlapped_collectives_leave_less_exposed_and_the_compute_stays() {
    let whole = run(&scenario("dgx-h100", Some(false)));
    let over = run(&scenario("dgx-h100", Some(true)));
    let (a, b) = (&whole.breakdown_s, &over.breakdown_s);
    assert!(a.tp_exposed > 0.0, "nothing to hide: {a:?}");
    // Three of the five sequence-parallel collectives per layer and pass overlap; at tp 8
    // each is shorter than its GEMM, so what stays is the slowdown and one chunk.
    assert!(b.tp_exposed < 0.6 * a.tp_exposed, "exposed {} vs {}", b.tp_exposed, a.tp_exposed);
    assert!(over.step_time_s < whole.step_time_s, "{} vs {}", over.step_time_s, whole.step_time_s);
    assert!((b.compute / a.compute - 1.0).abs() < 0.01, "compute {} vs {}", b.compute, a.compute);
    // The same plan either way: the overlap is the backend's timing, not new ops.
    let (pa, pb) =
        (lower(&scenario("dgx-h100", Some(false))).unwrap(), lower(&scenario("dgx-h100", Some(true))).unwrap());
    assert_eq!(pa.programs, pb.programs);
}

#[test]
fn unset_it_is_on_for_megatron_on_hopper_and_off_on_ampere() {
    assert!(scenario("dgx-h100", None).tp_comm_overlap());
    assert!(!scenario("dgx-a100", None).tp_comm_overlap());
    let mut s = scenario("dgx-h100", None);
    s.parallel.sequence_parallel = false;
    assert!(!s.tp_comm_overlap(), "no sequence-parallel collectives, nothing to overlap");
    // Unset on Hopper simulates exactly as set true.
    let (auto, on) = (run(&scenario("dgx-h100", None)), run(&scenario("dgx-h100", Some(true))));
    assert_eq!(serde_json::to_string(&auto).unwrap(), serde_json::to_string(&on).unwrap());
}

#[test]
fn the_search_estimate_moves_with_the_simulation() {
    let profile = HardwareProfile::builtin(strata_models::GpuKind::H100Sxm);
    let base = scenario("dgx-h100", Some(false));
    let model = ComputeModel::new(&profile, base.training.storage_dtype());
    let mut est = Estimator::new(&base, model, &profile).unwrap();
    let whole = est.step_s(&base);
    let over = est.step_s(&scenario("dgx-h100", Some(true)));
    assert!(over < whole, "estimate {over} vs {whole}");
    let (sim_whole, sim_over) = (run(&base).step_time_s, run(&scenario("dgx-h100", Some(true))).step_time_s);
    // The estimate's saving is within a factor 2 of the simulated one.
    let (de, ds) = (whole - over, sim_whole - sim_over);
    assert!(de > 0.5 * ds && de < 2.0 * ds, "estimate saves {de} s, simulation {ds} s");
}
