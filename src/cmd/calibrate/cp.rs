//! What `strata calibrate` measures for context-parallel plans, whatever split the
//! calibrated scenario itself has: the split attention pieces (`AttnQkv`, `AttnCore` with its
//! ring steps, `AttnProj`) in real jobs of the model — every exchange (ring, all-gather,
//! Ulysses), every cp of 2 and 4 that the ranks and the sequence allow (2·cp chunks), with
//! every tensor-parallel size beside it — and the communicator's ring exchange and
//! all-to-all at the very sizes those plans send.

use std::collections::BTreeSet;

use strata_models::parallel::{CpComm, ParallelConfig, Recompute, Schedule};
use strata_models::plan::{CollKind, GroupKind, OpKind, lower};
use strata_models::{Dtype, Scenario};

/// Context-parallel sizes a plan of `s` on `ranks` ranks may use, for the calibration: 2,
/// 4 and the scenario's own, where they divide the ranks and 2·cp divides the sequence.
pub fn cp_sizes(s: &Scenario, ranks: u32) -> Vec<u32> {
    let all: BTreeSet<u32> = [2, 4, s.parallel.cp].into_iter().filter(|c| *c > 1 && cp_fits(s, ranks, 1, *c)).collect();
    all.into_iter().collect()
}

/// Whether a context-parallel split of `cp` ranks (with tp) fits `ranks` and the sequence
/// (2·cp chunks).
pub fn cp_fits(s: &Scenario, ranks: u32, tp: u32, cp: u32) -> bool {
    ranks.is_multiple_of(tp * cp) && s.model.seq_len.is_multiple_of(2 * cp)
}

/// One job of the model split `tp` × `cp` with `comm` at micro-batch `mb` (one stage, one
/// replica, fp32, every layer or `layers`), if the split is valid and lowers.
fn cp_job(s: &Scenario, tp: u32, cp: u32, comm: CpComm, mb: u32, layers: u32) -> Option<Scenario> {
    let mut j = s.clone();
    j.name = format!("calibrate-tp{tp}-cp{cp}-{}-mb{mb}", comm.key());
    j.model.layers = layers;
    j.cluster.nodes = 1;
    j.cluster.gpus_per_node = tp * cp;
    j.training.dtype = Dtype::Fp32;
    j.parallel = ParallelConfig {
        tp,
        pp: 1,
        dp: 1,
        cp,
        cp_comm: comm,
        vpp: 1,
        schedule: Schedule::OneFOneB,
        micro_batch: mb,
        global_batch: 2 * mb,
        zero: 0,
        recompute: Recompute::None,
        // MoE with tp needs sequence parallelism (as in `piece_jobs`).
        sequence_parallel: s.model.moe.is_some() && tp > 1,
        ep: 1,
        ..s.parallel.clone()
    };
    // Ulysses needs the heads of a tp rank to split over cp; a split that cannot run is left out.
    (j.validate().is_ok() && lower(&j).is_ok()).then_some(j)
}

/// Jobs that run the split attention pieces at the shapes context-parallel plans give them:
/// every cp of [`cp_sizes`], every exchange, every tensor-parallel size in `tps` that fits
/// beside it, at the scenario's micro-batch and (unless `quick`) at `other_mb` too.
pub fn cp_jobs(s: &Scenario, ranks: u32, tps: &[u32], other_mb: u32, quick: bool) -> Vec<Scenario> {
    let layers = if quick { s.model.layers.min(4) } else { s.model.layers };
    let mut mbs = vec![s.parallel.micro_batch.max(1)];
    if !quick && other_mb != mbs[0] {
        mbs.push(other_mb);
    }
    let mut jobs = Vec::new();
    for cp in cp_sizes(s, ranks) {
        for &tp in tps.iter().filter(|t| cp_fits(s, ranks, **t, cp)) {
            for comm in CpComm::ALL {
                jobs.extend(mbs.iter().filter_map(|&mb| cp_job(s, tp, cp, comm, mb, layers)));
            }
        }
    }
    jobs
}

/// The (group sizes, message sizes) of what context-parallel plans of `s` on `ranks` ranks
/// send over the cp group as ring exchanges and all-to-alls: every cp, exchange, tp and
/// micro-batch in `mbs`, read off the lowered plans (one layer each).
pub fn cp_messages(s: &Scenario, ranks: u32, tps: &[u32], mbs: &[u32]) -> (Vec<u32>, Vec<u64>) {
    let (mut groups, mut sizes) = (BTreeSet::new(), BTreeSet::new());
    for cp in cp_sizes(s, ranks) {
        for &tp in tps.iter().filter(|t| cp_fits(s, ranks, **t, cp)) {
            for comm in [CpComm::Ring, CpComm::Ulysses] {
                for &mb in mbs {
                    let Some(plan) = cp_job(s, tp, cp, comm, mb, 1).and_then(|j| lower(&j).ok()) else { continue };
                    for op in &plan.program(0).ops {
                        if let OpKind::Collective(c) = &op.kind
                            && c.group == GroupKind::Cp
                            && matches!(c.kind, CollKind::RingExchange | CollKind::AllToAll)
                        {
                            groups.insert(cp);
                            sizes.insert(c.bytes);
                        }
                    }
                }
            }
        }
    }
    (groups.into_iter().collect(), sizes.into_iter().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny() -> Scenario {
        let text = "[model]\npreset = \"tiny-gpt\"\n[cluster]\npreset = \"cpu-local\"\ngpus_per_node = 8\n\
                    [parallel]\ntp = 2\npp = 2\ndp = 2\nmicro_batch = 2\nglobal_batch = 16\n";
        Scenario::from_toml(text, "t", "t", &[]).unwrap()
    }

    #[test]
    fn a_dense_scenario_still_measures_every_context_parallel_split() {
        let s = tiny();
        assert_eq!(s.parallel.cp, 1);
        assert_eq!(cp_sizes(&s, 8), vec![2, 4]);
        let jobs = cp_jobs(&s, 8, &[1, 2, 4], 4, true);
        let names: Vec<&str> = jobs.iter().map(|j| j.name.as_str()).collect();
        // tiny-gpt has 4 heads: Ulysses runs where heads / tp divide by cp.
        for want in ["tp2-cp2-ring-mb2", "tp2-cp2-all-gather-mb2", "tp2-cp2-ulysses-mb2", "tp1-cp4-ring-mb2"] {
            assert!(names.iter().any(|n| n.ends_with(want)), "{want} in {names:?}");
        }
        assert!(!names.iter().any(|n| n.ends_with("tp2-cp4-ulysses-mb2")), "{names:?}");
        assert!(jobs.iter().all(|j| j.parallel.ranks() == (j.parallel.tp * j.parallel.cp) as u64));
        // A sequence that 2·cp does not divide, or too few ranks, measures no such split.
        let mut odd = s.clone();
        odd.model.seq_len = 36;
        assert_eq!(cp_sizes(&odd, 8), vec![2]);
        assert_eq!(cp_sizes(&s, 3), Vec::<u32>::new());
    }

    #[test]
    fn the_messages_are_those_the_plans_send() {
        let s = tiny();
        let (groups, sizes) = cp_messages(&s, 8, &[1, 2], &[2]);
        assert_eq!(groups, vec![2, 4]);
        // tp 2, cp 2, mb 2: each rank's K and V, 2·32 tokens × 2·32 channels × 4 bytes.
        assert!(sizes.contains(&(64 * 2 * 32 * 4)), "{sizes:?}");
        // Ulysses at tp 1, cp 4: Q, K and V of 32 tokens × 3·64 channels.
        assert!(sizes.contains(&(32 * 3 * 64 * 4)), "{sizes:?}");
    }
}
