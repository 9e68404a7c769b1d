//! Megatron-LM's unfused vocab-parallel cross entropy in the plan: the head's compute ops
//! carry its fp32 passes over the rank's logits (cast, max, subtract, exp, sum, divide;
//! multiply and cast back in backward), under Megatron-LM and DeepSpeed (Megatron-DeepSpeed)
//! and not under torchtitan or Strata's executor; `vocab-ce` off gives the generic cost.
//!
//! Its own test binary: the mechanic switch is process-wide, so no other suite's lowering
//! sees it off; within this binary the tests take [`SWITCH`] so that the one that turns it
//! off does not race the other's lowering.

use strata_models::Scenario;
use strata_models::framework::mechanics::{Mechanic, set_disabled};
use strata_models::plan::*;

/// Held by every test of this binary while it lowers (the switch is process-wide).
static SWITCH: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn scenario(framework: &str, tp: u32, pp: u32) -> Scenario {
    // GPT 1.7B of Megatron-LM's H100 table: h 2048, vocabulary 131,072, sequence 4096.
    let text = format!(
        "[model]\npreset = \"gpt3-175b\"\nlayers = 4\nhidden = 2048\nheads = 16\nkv_heads = 16\nffn_hidden = 8192\nvocab = 131072\nseq_len = 4096\n[cluster]\npreset = \"dgx-h100\"\nnodes = 1\n[parallel]\ntp = {tp}\npp = {pp}\ndp = {}\nglobal_batch = {}\nmicro_batch = 1\nzero = {}\nsequence_parallel = {}\n[training]\nframework = \"{framework}\"\n",
        8 / (tp * pp),
        2 * 8 / tp,
        if framework == "torchtitan" { 0 } else { 1 },
        tp > 1 && framework != "deepspeed",
    );
    Scenario::from_toml(&text, "ce", "ce", &[]).unwrap()
}

/// (mem_bytes, kernels) of the last stage's first compute op of `piece` in `phase`.
fn head_cost(plan: &Plan, piece: Piece, phase: Phase) -> (u64, u32) {
    let prog = plan.programs.last().unwrap();
    let c = prog
        .ops
        .iter()
        .find_map(|o| match &o.kind {
            OpKind::Compute(c) if c.piece == piece && c.phase == phase => Some(c.cost),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no {piece:?} {phase:?} op"));
    let cost = &plan.costs[c as usize];
    (cost.mem_bytes, cost.kernels)
}

#[test]
fn megatron_loss_carries_the_vocab_parallel_cross_entropy_passes() {
    let _switch = SWITCH.lock().unwrap_or_else(|e| e.into_inner());
    for tp in [1u32, 2] {
        // N = T · V/t local logits, bf16 (2 bytes) out of the output layer's GEMM.
        let n = 4096u64 * 131_072 / tp as u64;
        for fw in ["megatron", "deepspeed"] {
            let plan = lower(&scenario(fw, tp, 1)).unwrap();
            verify(&plan).unwrap();
            // .float() 2+4, max 4, subtract 4+4, exp 4+4, sum 4 (+ the GEMM): 30 bytes each.
            assert_eq!(head_cost(&plan, Piece::Logits, Phase::Forward), (30 * n, 6), "{fw} tp{tp}");
            // The per-token scalars as before, then the softmax's in-place division 4+4.
            let (loss, k) = head_cost(&plan, Piece::Loss, Phase::Forward);
            assert_eq!((loss, k), (4096 * 3 * 4 * tp as u64 + 8 * n, 2), "{fw} tp{tp}");
            // Multiply by the loss gradient 4+4, cast back 4+2.
            assert_eq!(head_cost(&plan, Piece::Logits, Phase::BackwardInput), (14 * n, 3), "{fw} tp{tp}");
        }
        // torchtitan and Strata's executor: the generic head (fp32 logits written and read).
        for fw in ["torchtitan", "strata"] {
            if fw == "torchtitan" && tp > 1 {
                continue; // torchtitan's tp plan needs sequence parallelism; the test's split is plain
            }
            let plan = lower(&scenario(fw, tp, 1)).unwrap();
            assert_eq!(head_cost(&plan, Piece::Logits, Phase::Forward), (8 * n, 2), "{fw} tp{tp}");
            assert_eq!(head_cost(&plan, Piece::Logits, Phase::BackwardInput), (6 * n, 2), "{fw} tp{tp}");
        }
    }
}

#[test]
fn the_switch_turns_the_cross_entropy_passes_off_and_on() {
    // Only this test toggles the process-wide switch (see the module comment).
    let _switch = SWITCH.lock().unwrap_or_else(|e| e.into_inner());
    let s = scenario("megatron", 2, 2);
    let n = 4096u64 * 131_072 / 2;
    set_disabled(&[Mechanic::VocabCrossEntropy]);
    let off = lower(&s);
    set_disabled(&[]);
    let on = lower(&s).unwrap();
    let off = off.unwrap();
    assert_eq!(head_cost(&off, Piece::Logits, Phase::Forward), (8 * n, 2));
    assert_eq!(head_cost(&off, Piece::Logits, Phase::BackwardInput), (6 * n, 2));
    assert_eq!(head_cost(&on, Piece::Logits, Phase::Forward), (30 * n, 6));
    // Only the head's costs differ: every other compute op of the plan costs the same.
    let others = |p: &Plan| -> Vec<(u64, u64)> {
        p.programs
            .iter()
            .flat_map(|prog| prog.ops.iter())
            .filter_map(|o| match &o.kind {
                OpKind::Compute(c) if !matches!(c.piece, Piece::Logits | Piece::Loss) => {
                    let k = &p.costs[c.cost as usize];
                    Some((k.flops, k.mem_bytes))
                }
                _ => None,
            })
            .collect()
    };
    assert_eq!(others(&off), others(&on));
    assert!(Mechanic::ALL.iter().any(|m| m.key() == "vocab-ce"));
}
