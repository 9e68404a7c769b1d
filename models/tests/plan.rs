//! The plan IR end to end: golden programs, verification of random scenarios, mutations
//! the verifier must catch, memory and communication volumes against the closed forms.

mod common;
use common::program_order_peak;
use proptest::prelude::*;
use strata_models::Scenario;
use strata_models::accounting::memory::{layer_activation_bytes, stage_memory};
use strata_models::parallel::{Recompute, Schedule};
use strata_models::plan::text::program_text;
use strata_models::plan::*;

/// A toy GPT (2 layers per stage, hidden 8) small enough to read a whole program.
#[allow(clippy::too_many_arguments)]
fn toy(tp: u32, pp: u32, dp: u32, vpp: u32, schedule: Schedule, zero: u8, m: u32, layers: u32) -> Scenario {
    toy_family("gpt", tp, pp, dp, vpp, schedule, zero, m, layers)
}

#[allow(clippy::too_many_arguments)]
fn toy_family(
    family: &str,
    tp: u32,
    pp: u32,
    dp: u32,
    vpp: u32,
    schedule: Schedule,
    zero: u8,
    m: u32,
    layers: u32,
) -> Scenario {
    let text = format!(
        r#"
[model]
family = "{family}"
layers = {layers}
hidden = 8
heads = 2
ffn_hidden = 32
vocab = 16
seq_len = 8
[cluster]
preset = "cpu-local"
gpus_per_node = {gpus}
[parallel]
tp = {tp}
pp = {pp}
dp = {dp}
vpp = {vpp}
schedule = "{sched}"
global_batch = {gb}
zero = {zero}
"#,
        gpus = tp * pp * dp,
        sched = schedule.key(),
        gb = m * dp,
    );
    Scenario::from_toml(&text, "toy", "toy", &[]).unwrap_or_else(|e| panic!("{e}"))
}

fn golden(name: &str, s: &Scenario, ranks: &[u32]) {
    let plan = lower(s).unwrap();
    verify(&plan).unwrap();
    let mut text = String::new();
    for r in ranks {
        text.push_str(&program_text(&plan, *r));
    }
    let path = format!("{}/tests/snapshots/{name}.txt", env!("CARGO_MANIFEST_DIR"));
    expect_test::expect_file![path].assert_eq(&text);
}

#[test]
fn golden_gpipe() {
    golden("gpipe", &toy(1, 2, 1, 1, Schedule::Gpipe, 0, 2, 2), &[0, 1]);
}

#[test]
fn golden_1f1b_tp2() {
    golden("1f1b-tp2", &toy(2, 2, 1, 1, Schedule::OneFOneB, 0, 3, 2), &[0, 2]);
}

#[test]
fn golden_interleaved() {
    golden("interleaved", &toy(1, 2, 1, 2, Schedule::Interleaved, 0, 2, 4), &[0]);
}

#[test]
fn golden_zb_h1() {
    golden("zb-h1", &toy(1, 2, 1, 1, Schedule::ZbH1, 0, 3, 2), &[0, 1]);
}

#[test]
fn golden_zb_h2() {
    // Two stages, three microbatches: the first stage's full warm-up (2p − 1 = 3 forwards).
    golden("zb-h2", &toy(1, 2, 1, 1, Schedule::ZbH2, 0, 3, 2), &[0, 1]);
}

#[test]
fn golden_zero_stages() {
    for zero in 1..=3 {
        golden(&format!("zero{zero}"), &toy(1, 1, 2, 1, Schedule::OneFOneB, zero, 2, 2), &[0]);
    }
}

#[test]
fn plans_survive_json() {
    let plan = lower(&toy(2, 2, 2, 1, Schedule::OneFOneB, 1, 4, 2)).unwrap();
    let back: Plan = serde_json::from_str(&serde_json::to_string(&plan).unwrap()).unwrap();
    assert_eq!(plan, back);
}

prop_compose! {
    fn any_scenario()(tp in prop::sample::select(vec![1u32, 2, 4]), pp in 1u32..5, dp in 1u32..4,
                      vpp in 1u32..3, sched in 0usize..Schedule::ALL.len(), zero in 0u8..4, rc in 0usize..3, sp: bool,
                      mb in 1u32..3, mfac in 1u32..4, layers in prop::sample::select(vec![4u32, 6, 8]),
                      bucket in prop::sample::select(vec![0.001f64, 0.01, 1.0]),
                      overlap_grad: bool, overlap_param: bool, flash: bool, clip: bool) -> Option<Scenario> {
        let schedule = Schedule::ALL[sched];
        let vpp = if schedule == Schedule::Interleaved { vpp + 1 } else { 1 };
        let m = if schedule == Schedule::Interleaved { pp * mfac } else { mfac + pp / 2 };
        let text = format!(
            "[model]\nfamily = \"gpt\"\nlayers = {layers}\nhidden = 16\nheads = 4\nffn_hidden = 64\nvocab = 32\nseq_len = 8\n\
             [cluster]\npreset = \"cpu-local\"\ngpus_per_node = {}\n\
             [parallel]\ntp = {tp}\npp = {pp}\ndp = {dp}\nvpp = {vpp}\nschedule = \"{}\"\nmicro_batch = {mb}\nglobal_batch = {}\n\
             zero = {zero}\nrecompute = \"{}\"\nsequence_parallel = {}\ngrad_bucket_mb = {bucket}\n\
             overlap_grad_reduce = {overlap_grad}\noverlap_param_gather = {overlap_param}\n\
             [training]\nflash_attention = {flash}\ngrad_clip = {}\n",
            tp * pp * dp, schedule.key(), m * mb * dp, Recompute::ALL[rc].key(), sp && tp > 1, if clip { 1.0 } else { 0.0 });
        Scenario::from_toml(&text, "prop", "prop", &[]).ok()
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// Every plan the planner emits passes the verifier.
    #[test]
    fn planner_plans_verify(s in any_scenario()) {
        prop_assume!(s.is_some());
        let s = s.unwrap();
        let plan = lower(&s).unwrap();
        if let Err(e) = verify(&plan) {
            panic!("{e}\n{}", s.to_toml());
        }
    }
}

/// Removes op `i` from a program, renumbering dependencies.
fn remove_op(p: &mut Program, i: usize) {
    p.ops.remove(i);
    for op in &mut p.ops {
        op.deps.retain(|d| *d as usize != i);
        for d in &mut op.deps {
            if *d as usize > i {
                *d -= 1;
            }
        }
    }
}

fn base_plan() -> Plan {
    lower(&toy(2, 2, 1, 1, Schedule::OneFOneB, 0, 3, 2)).unwrap()
}

#[test]
fn mutation_dropped_receive_is_caught() {
    let mut plan = base_plan();
    let prog = &mut plan.programs[1];
    let i = prog.ops.iter().position(|o| matches!(o.kind, OpKind::Recv(_))).unwrap();
    remove_op(prog, i);
    let e = verify(&plan).unwrap_err();
    assert_eq!(e.kind, "unmatched", "{e}");
    assert!(e.to_string().contains("is never received"), "{e}");
    assert!(e.location.contains("send next act mb0"), "{e}");
}

#[test]
fn mutation_swapped_collectives_on_one_rank_are_caught() {
    let mut plan = base_plan();
    let prog = plan.program_of_rank_mut(1);
    let tp: Vec<usize> = prog
        .ops
        .iter()
        .enumerate()
        .filter(|(_, o)| matches!(o.kind, OpKind::Collective(_)))
        .map(|(i, _)| i)
        .take(2)
        .collect();
    let (a, b) = (tp[0], tp[1]);
    let ka = prog.ops[a].kind.clone();
    prog.ops[a].kind = prog.ops[b].kind.clone();
    prog.ops[b].kind = ka;
    let e = verify(&plan).unwrap_err();
    assert_eq!(e.kind, "mismatch", "{e}");
    assert!(e.location.contains("rank(1)"), "{e}");
}

#[test]
fn mutation_changed_bytes_on_one_member_is_caught() {
    let mut plan = base_plan();
    let prog = plan.program_of_rank_mut(1);
    let op = prog.ops.iter_mut().find(|o| matches!(o.kind, OpKind::Collective(_))).unwrap();
    if let OpKind::Collective(c) = &mut op.kind {
        c.bytes += 2;
    }
    let e = verify(&plan).unwrap_err();
    assert_eq!(e.kind, "mismatch", "{e}");
    assert!(e.reason.contains("where") && e.location.contains("rank(1)"), "{e}");
}

#[test]
fn mutation_freeing_a_live_buffer_is_caught() {
    let mut plan = base_plan();
    let prog = &mut plan.programs[0];
    // Free the first activation buffer right after it is allocated.
    let (i, buf) = prog
        .ops
        .iter()
        .enumerate()
        .find_map(|(i, o)| match &o.kind {
            OpKind::Alloc(a) if a.name.starts_with("act ") => Some((i, a.buf)),
            _ => None,
        })
        .unwrap();
    let free = prog.ops.iter().position(|o| o.kind == OpKind::Free { buf }).unwrap();
    let mut op = prog.ops[free].clone();
    op.deps.clear();
    remove_op(prog, free);
    prog.ops.insert(i + 1, op);
    for o in &mut prog.ops[i + 2..] {
        for d in &mut o.deps {
            if *d as usize > i {
                *d += 1;
            }
        }
    }
    let e = verify(&plan).unwrap_err();
    assert_eq!(e.kind, "lifetime", "{e}");
    assert!(e.reason.contains("live buffer") && e.reason.contains("act L0 mb0"), "{e}");
}

#[test]
fn mutation_circular_wait_is_a_deadlock() {
    let mut plan = base_plan();
    // Make stage 0 receive the gradient of microbatch 0 before it sends that microbatch's
    // activation: each stage then waits for the other.
    let prog = &mut plan.programs[0];
    let recv = prog
        .ops
        .iter()
        .position(|o| matches!(&o.kind, OpKind::Recv(p) if p.kind == P2pKind::Gradient && p.mb == 0))
        .unwrap();
    let mut op = prog.ops[recv].clone();
    op.deps.clear();
    let alloc_of_recv = op.bufs[0];
    remove_op(prog, recv);
    let first_send = prog.ops.iter().position(|o| matches!(o.kind, OpKind::Send(_))).unwrap();
    // Put the receive (and its buffer's allocation) ahead of the first send on the pp stream.
    let alloc = prog.ops.iter().position(|o| matches!(&o.kind, OpKind::Alloc(a) if a.buf == alloc_of_recv)).unwrap();
    let alloc_op = prog.ops[alloc].clone();
    remove_op(prog, alloc);
    let at = first_send.min(alloc) - 1;
    for (k, o) in [alloc_op, op].into_iter().enumerate() {
        prog.ops.insert(at + k, o);
        for later in &mut prog.ops[at + k + 1..] {
            for d in &mut later.deps {
                if *d as usize >= at + k {
                    *d += 1;
                }
            }
        }
    }
    let e = verify(&plan).unwrap_err();
    assert_eq!(e.kind, "deadlock", "{e}");
    assert!(e.reason.contains("recv next grad mb0"), "{e}");
}

/// The peak of each rank's Alloc/Free timeline (in program order) agrees with the analytic
/// memory model within 3% on every stage: both count the same tensors, but the plan also
/// holds a pipeline message or two and (under 1F1B) a transient logits buffer that the
/// analytic model places only on the last stage, and the analytic model averages uneven
/// chunks.
#[test]
fn alloc_free_peak_agrees_with_the_analytic_model() {
    for (preset, tp, pp, dp, sched, vpp, zero, rc, sp) in [
        ("gpt3-175b", 8, 8, 4, Schedule::OneFOneB, 1, 1, Recompute::Selective, true),
        ("gpt3-175b", 8, 8, 4, Schedule::Interleaved, 3, 1, Recompute::Selective, true),
        ("gpt3-175b", 8, 8, 4, Schedule::Gpipe, 1, 0, Recompute::Full, false),
        ("gpt3-175b", 8, 4, 8, Schedule::OneFOneB, 1, 2, Recompute::None, true),
        ("llama3-70b", 8, 4, 8, Schedule::OneFOneB, 1, 1, Recompute::Selective, true),
        ("llama3-70b", 4, 8, 8, Schedule::ZbH1, 1, 1, Recompute::None, true),
    ] {
        let text = format!(
            "[model]\npreset = \"{preset}\"\n[cluster]\npreset = \"dgx-h100\"\nnodes = {}\n[parallel]\ntp = {tp}\npp = {pp}\ndp = {dp}\nvpp = {vpp}\nschedule = \"{}\"\nglobal_batch = {}\nzero = {zero}\nrecompute = \"{}\"\nsequence_parallel = {sp}\n[training]\nframework = \"strata\"\n",
            tp * pp * dp / 8,
            sched.key(),
            16 * dp,
            rc.key()
        );
        let s = Scenario::from_toml(&text, "mem", "mem", &[]).unwrap();
        let plan = lower(&s).unwrap();
        let analytic = stage_memory(&s);
        for stage in 0..pp {
            let ours = program_order_peak(&plan.programs[stage as usize]) as f64;
            let theirs = analytic[stage as usize].total_bytes();
            let err = (ours / theirs - 1.0).abs();
            assert!(
                err < 0.03,
                "{preset} {sched:?} zero{zero} {rc:?} stage {stage}: plan {ours:.4e} vs analytic {theirs:.4e} ({:.2}%)",
                err * 100.0
            );
        }
    }
}

/// The same agreement under each framework's layout: Megatron-LM's fp32 main gradients,
/// DeepSpeed's ZeRO-2/3 partitions, FSDP2's fp32 shards — the lowering allocates what the
/// analytic model counts.
#[test]
fn alloc_free_peak_agrees_with_the_analytic_model_per_framework() {
    for (framework, preset, tp, pp, dp, sched, vpp, zero, sp) in [
        ("megatron", "gpt3-175b", 8, 8, 4, "interleaved", 3, 1, true),
        ("megatron", "llama3-70b", 8, 4, 8, "1f1b", 1, 0, true),
        ("deepspeed", "llama3-8b", 1, 1, 8, "1f1b", 1, 2, false),
        ("deepspeed", "llama3-8b", 1, 1, 16, "1f1b", 1, 3, false),
        ("deepspeed", "gpt3-175b", 8, 8, 4, "1f1b", 1, 1, false),
        ("torchtitan", "llama3-8b", 2, 1, 8, "1f1b", 1, 3, true),
        ("torchtitan", "llama3-70b", 8, 4, 4, "gpipe", 1, 2, true),
        // Gradients accumulated unsharded per chunk until the step's reduce-scatter.
        ("torchtitan", "llama3-70b", 8, 4, 4, "interleaved", 2, 2, true),
    ] {
        let text = format!(
            "[model]\npreset = \"{preset}\"\n[cluster]\npreset = \"dgx-h100\"\nnodes = {}\n[parallel]\ntp = {tp}\npp = {pp}\ndp = {dp}\nvpp = {vpp}\nschedule = \"{sched}\"\nglobal_batch = {}\nzero = {zero}\nrecompute = \"selective\"\nsequence_parallel = {sp}\n[training]\nframework = \"{framework}\"\n",
            tp * pp * dp / 8,
            4 * dp * pp,
        );
        let s = Scenario::from_toml(&text, "mem", "mem", &[]).unwrap();
        let plan = lower(&s).unwrap();
        let analytic = stage_memory(&s);
        for stage in 0..pp {
            let ours = program_order_peak(&plan.programs[stage as usize]) as f64;
            let theirs = analytic[stage as usize].total_bytes();
            let err = (ours / theirs - 1.0).abs();
            assert!(
                err < 0.03,
                "{framework} {preset} zero{zero} stage {stage}: plan {ours:.4e} vs analytic {theirs:.4e} ({:.2}%)",
                err * 100.0
            );
        }
    }
}

/// Σ over the collectives of one kind of group of busbw factor × S: the bytes each member
/// sends (nccl-tests' bus traffic).
fn traffic(plan: &Plan, stage: usize, group: GroupKind, filter: impl Fn(&CollPurpose) -> bool) -> f64 {
    let n = |g: GroupKind| match g {
        GroupKind::Embedding => 2,
        g => plan.grid.group_size(g),
    } as u64;
    plan.programs[stage]
        .ops
        .iter()
        .filter_map(|o| match &o.kind {
            OpKind::Collective(c) if c.group == group && filter(&c.purpose) => {
                Some(c.kind.bus_factor(n(group)) * c.bytes as f64)
            }
            _ => None,
        })
        .sum()
}

#[test]
fn tensor_parallel_traffic_is_8bsh_per_layer_and_microbatch() {
    // Narayanan et al. SC'21 §3.3: each layer moves 8·b·s·h·(t−1)/t elements per device per
    // microbatch (four all-reduces of b·s·h, 2(t−1)/t each), here in bf16 bytes.
    for (t, sp) in [(2u32, false), (4, false), (8, false), (8, true)] {
        let text = format!(
            "[model]\npreset = \"gpt3-175b\"\n[cluster]\npreset = \"dgx-a100\"\n[parallel]\ntp = {t}\npp = 1\ndp = {}\nglobal_batch = {}\nmicro_batch = 2\nsequence_parallel = {sp}\n",
            8 / t,
            2 * 8 / t
        );
        let s = Scenario::from_toml(&text, "tp", "tp", &[]).unwrap();
        let plan = lower(&s).unwrap();
        let layer_traffic = traffic(
            &plan,
            0,
            GroupKind::Tp,
            |p| matches!(p, CollPurpose::Tp { piece, site, layer: 5, mb: 0, .. } if piece.in_layer() && *site != TpSite::GatherSaved),
        );
        let (b, sq, h) = (2.0, 2048.0, 12288.0);
        let expected = 8.0 * b * sq * h * (t as f64 - 1.0) / t as f64 * 2.0;
        assert!((layer_traffic / expected - 1.0).abs() < 1e-12, "t={t} sp={sp}: {layer_traffic} vs {expected}");
    }
}

#[test]
fn zero3_moves_one_and_a_half_times_zero1_and_2() {
    // Rajbhandari et al. SC'20 §7: stages 1–2 move 2Ψ per step, stage 3 moves 3Ψ
    // (one microbatch, so every parameter is gathered once forward and once backward). An
    // untied model: a tied embedding is used twice per pass and ZeRO-3 gathers it twice.
    let mut per_stage = Vec::new();
    for zero in 1..=3u8 {
        // One bucket per unit, and only the layers counted: the embedding's backward needs no
        // weights, so ZeRO-3 gathers it once, not twice.
        let mut s = toy_family("llama", 1, 1, 4, 1, Schedule::OneFOneB, zero, 1, 4);
        s.parallel.grad_bucket_mb = 1e-9;
        let plan = lower(&s).unwrap();
        let layer_bucket = |b: &u32| plan.buckets[0][*b as usize].units.iter().all(|u| matches!(u, Unit::Layer(_)));
        per_stage.push(traffic(&plan, 0, GroupKind::Dp, |p| match p {
            CollPurpose::GradBucket { bucket, .. }
            | CollPurpose::ParamBucket { bucket, .. }
            | CollPurpose::ParamGather { bucket, .. } => layer_bucket(bucket),
            _ => false,
        }));
    }
    assert!((per_stage[0] - per_stage[1]).abs() < 1e-9, "{per_stage:?}");
    assert!((per_stage[2] / per_stage[0] - 1.5).abs() < 1e-9, "{per_stage:?}");
}

#[test]
fn interleaving_multiplies_pipeline_traffic_by_vpp() {
    let sent = |plan: &Plan| -> u64 {
        plan.programs
            .iter()
            .flat_map(|p| &p.ops)
            .filter_map(|o| if let OpKind::Send(p) = &o.kind { Some(p.bytes) } else { None })
            .sum()
    };
    let base = sent(&lower(&toy(1, 4, 1, 1, Schedule::OneFOneB, 0, 8, 8)).unwrap());
    {
        let v = 2u32;
        let inter = sent(&lower(&toy(1, 4, 1, v, Schedule::Interleaved, 0, 8, 8)).unwrap());
        // p·v − 1 chunk boundaries instead of p − 1, both ways.
        let expected = base as f64 * (4.0 * v as f64 - 1.0) / 3.0;
        assert_eq!(inter as f64, expected, "v={v}");
        assert!(inter as f64 / base as f64 >= v as f64);
    }
}

#[test]
fn activation_buffers_are_sized_by_the_formula() {
    let s = toy(2, 1, 1, 1, Schedule::OneFOneB, 0, 1, 2);
    let plan = lower(&s).unwrap();
    let expected =
        layer_activation_bytes(&s.model, 1, s.training.storage_dtype(), 2, false, Recompute::None, false).ceil() as u64;
    let act = plan.programs[0].ops.iter().find_map(|o| match &o.kind {
        OpKind::Alloc(a) if a.name == "act L0 mb0" => Some(a.bytes),
        _ => None,
    });
    assert_eq!(act, Some(expected));
}
