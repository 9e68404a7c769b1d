//! The shared-GPU communicator's bookkeeping: several ranks of one plan on one GPU, each on
//! its own streams, meet in a collective as device copies and additions between their
//! buffers. Given every member's contribution (its input and output on the device), this
//! plans each member's stream work, which the multi-rank driver (`multi`) enqueues once
//! every member has arrived (matched by the plan's `Rendezvous`, as the CPU communicator is).
//!
//! **Determinism.** Every member sums the contributions itself, in rank order (member 0's,
//! then 1's, …), so all members hold bit-identical results, equal to one fixed order of
//! fp32 (or bf16) additions — never an order that depends on timing.
//!
//! **Two phases.** A member's output may be its input (an in-place all-reduce) or overlap
//! it (an all-gather into the buffer that holds its slice), while the others still read
//! that input. So each member first reduces or gathers into a scratch block of its own and
//! records *read done*; only after every member's read-done does it copy its scratch to its
//! output. Phase one waits for every member's *contribution ready* event (recorded by the
//! member when its input was complete).
//!
//! The multi-rank driver (`multi`) enqueues these steps once every member has arrived; the
//! plan below is tested on host memory under adversarial interleavings of the members'
//! streams.

use strata_models::plan::CollKind;

use super::device::Ptr;

/// One member's part in a collective: element offsets are in elements of `elem_bytes`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Member {
    pub input: Ptr,
    pub output: Ptr,
    /// A block of the output's size, for phase one.
    pub scratch: Ptr,
}

/// An event of the collective: member m's input is ready, or it is done reading inputs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Ev {
    Ready(usize),
    ReadDone(usize),
}

/// Work on one member's stream, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    Wait(Ev),
    Record(Ev),
    /// dst ← src, `elems` elements.
    Copy {
        dst: Ptr,
        src: Ptr,
        elems: usize,
    },
    /// dst += src, `elems` elements (the `add` kernel).
    Add {
        dst: Ptr,
        src: Ptr,
        elems: usize,
    },
}

/// Each member's steps (by member position) for a collective of `elems` elements per
/// member input (an all-gather's input is one slice; a reduce-scatter's output is one).
pub fn plan(kind: CollKind, members: &[Member], elems: usize, elem_bytes: u64) -> Result<Vec<Vec<Step>>, String> {
    let n = members.len();
    if n == 0 {
        return Err("a collective of no members".into());
    }
    let at = |p: Ptr, i: usize| p + i as u64 * elem_bytes;
    let mut out = Vec::with_capacity(n);
    for (m, me) in members.iter().enumerate() {
        let mut s: Vec<Step> = (0..n).filter(|&r| r != m).map(|r| Step::Wait(Ev::Ready(r))).collect();
        let out_elems = match kind {
            CollKind::AllReduce => {
                s.push(Step::Copy { dst: me.scratch, src: members[0].input, elems });
                for r in members.iter().skip(1) {
                    s.push(Step::Add { dst: me.scratch, src: r.input, elems });
                }
                elems
            }
            CollKind::ReduceScatter => {
                if !elems.is_multiple_of(n) {
                    return Err(format!("a reduce-scatter of {elems} elements over {n} members"));
                }
                let k = elems / n;
                s.push(Step::Copy { dst: me.scratch, src: at(members[0].input, m * k), elems: k });
                for r in members.iter().skip(1) {
                    s.push(Step::Add { dst: me.scratch, src: at(r.input, m * k), elems: k });
                }
                k
            }
            CollKind::AllGather => {
                for (r, x) in members.iter().enumerate() {
                    s.push(Step::Copy { dst: at(me.scratch, r * elems), src: x.input, elems });
                }
                n * elems
            }
            other => return Err(format!("{} on the shared-GPU communicator is not built", other.key())),
        };
        s.push(Step::Record(Ev::ReadDone(m)));
        s.extend((0..n).filter(|&r| r != m).map(|r| Step::Wait(Ev::ReadDone(r))));
        s.push(Step::Copy { dst: me.output, src: me.scratch, elems: out_elems });
        out.push(s);
    }
    Ok(out)
}

/// One collective over several segments (a bucket's units, each contiguous in the flat
/// buffers): `segments[i]` are the members of segment i, `elems[i]` its size. Each member
/// waits for the others' Ready once, does every segment's phase one, records ReadDone
/// once, waits for the others' once, then does every segment's phase two — the same sums
/// as one [`plan`] per segment, with one barrier.
pub fn plan_segments(
    kind: CollKind,
    segments: &[Vec<Member>],
    elems: &[usize],
    elem_bytes: u64,
) -> Result<Vec<Vec<Step>>, String> {
    let n = segments.first().map_or(0, Vec::len);
    let mut one: Vec<Vec<Step>> = vec![Vec::new(); n];
    let mut two: Vec<Vec<Step>> = vec![Vec::new(); n];
    for (seg, &e) in segments.iter().zip(elems) {
        if seg.len() != n {
            return Err(format!("a segment of {} members in a collective of {n}", seg.len()));
        }
        for (m, steps) in plan(kind, seg, e, elem_bytes)?.into_iter().enumerate() {
            let cut = steps.iter().position(|s| *s == Step::Record(Ev::ReadDone(m))).expect("every member records");
            one[m].extend(steps[..cut].iter().filter(|s| !matches!(s, Step::Wait(_))));
            two[m].extend(steps[cut + 1..].iter().filter(|s| !matches!(s, Step::Wait(_))));
        }
    }
    Ok((0..n)
        .map(|m| {
            let others = (0..n).filter(move |&r| r != m);
            let mut s: Vec<Step> = others.clone().map(|r| Step::Wait(Ev::Ready(r))).collect();
            s.append(&mut one[m]);
            s.push(Step::Record(Ev::ReadDone(m)));
            s.extend(others.map(|r| Step::Wait(Ev::ReadDone(r))));
            s.append(&mut two[m]);
            s
        })
        .collect())
}

/// A collective over parts of the members' buffers, for ZeRO's uneven shards: `parts[m]`
/// are member m's (offset, elements) ranges, in elements of `elem_bytes` from each base.
/// `sum` (a reduce-scatter): member m adds every member's input over its own parts, in rank
/// order, into its output there. Otherwise (an all-gather): member m copies every other
/// member r's input over r's parts into its output there. Each member's scratch holds what
/// it gathers (`parts_scratch`); the two phases are [`plan`]'s.
pub fn plan_parts(
    sum: bool,
    inputs: &[Ptr],
    outputs: &[Ptr],
    scratch: &[Ptr],
    parts: &[Vec<(u64, usize)>],
    elem_bytes: u64,
) -> Vec<Vec<Step>> {
    let n = inputs.len();
    (0..n)
        .map(|m| {
            let others = (0..n).filter(move |&r| r != m);
            let mut s: Vec<Step> = others.clone().map(|r| Step::Wait(Ev::Ready(r))).collect();
            let mut out = Vec::new();
            let mut at = scratch[m];
            let from: Vec<usize> = if sum { vec![m] } else { others.clone().collect() };
            for r in from {
                for &(off, elems) in &parts[r] {
                    let b = off * elem_bytes;
                    if sum {
                        s.push(Step::Copy { dst: at, src: inputs[0] + b, elems });
                        s.extend(inputs[1..].iter().map(|x| Step::Add { dst: at, src: x + b, elems }));
                    } else {
                        s.push(Step::Copy { dst: at, src: inputs[r] + b, elems });
                    }
                    out.push(Step::Copy { dst: outputs[m] + b, src: at, elems });
                    at += elems as u64 * elem_bytes;
                }
            }
            s.push(Step::Record(Ev::ReadDone(m)));
            s.extend(others.map(|r| Step::Wait(Ev::ReadDone(r))));
            s.extend(out);
            s
        })
        .collect()
}

/// Elements of member m's scratch under [`plan_parts`].
pub fn parts_scratch(sum: bool, parts: &[Vec<(u64, usize)>], m: usize) -> usize {
    let count = |r: usize| parts[r].iter().map(|p| p.1).sum::<usize>();
    if sum { count(m) } else { (0..parts.len()).filter(|&r| r != m).map(count).sum() }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use rand::seq::SliceRandom;
    use rand::{RngExt, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    use super::*;

    /// Runs the members' steps on host memory (addresses are f32 indices), one stream at a
    /// time in an order drawn from `seed`: a stream runs a random number of steps, stopping
    /// at a wait whose event is not recorded yet. Every member records Ready first.
    fn run(mem: &mut [f32], steps: &[Vec<Step>], seed: u64) {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut recorded: BTreeSet<Ev> = (0..steps.len()).map(Ev::Ready).collect();
        let mut pc = vec![0usize; steps.len()];
        while pc.iter().zip(steps).any(|(p, s)| *p < s.len()) {
            let mut order: Vec<usize> = (0..steps.len()).collect();
            order.shuffle(&mut rng);
            let mut moved = false;
            for m in order {
                let budget = rng.random_range(1..4);
                for _ in 0..budget {
                    let Some(step) = steps[m].get(pc[m]) else { break };
                    match *step {
                        Step::Wait(e) if !recorded.contains(&e) => break,
                        Step::Wait(_) => {}
                        Step::Record(e) => {
                            recorded.insert(e);
                        }
                        Step::Copy { dst, src, elems } => {
                            let v = mem[src as usize..][..elems].to_vec();
                            mem[dst as usize..][..elems].copy_from_slice(&v);
                        }
                        Step::Add { dst, src, elems } => {
                            for i in 0..elems {
                                mem[dst as usize + i] += mem[src as usize + i];
                            }
                        }
                    }
                    pc[m] += 1;
                    moved = true;
                }
            }
            assert!(moved, "the members' steps deadlock");
        }
    }

    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect()
    }

    #[test]
    fn an_in_place_all_reduce_sums_in_rank_order_on_every_member_under_any_interleaving() {
        let (n, e) = (4usize, 37usize);
        // Member m: input = output at m·e, scratch at 1000 + m·e.
        let members: Vec<Member> = (0..n)
            .map(|m| Member { input: (m * e) as u64, output: (m * e) as u64, scratch: (1000 + m * e) as u64 })
            .collect();
        let steps = plan(CollKind::AllReduce, &members, e, 1).unwrap();
        let init = values(n * e, 7);
        // The sum in rank order, as one rank would add them.
        let want: Vec<f32> = (0..e).map(|i| (1..n).fold(init[i], |acc, r| acc + init[r * e + i])).collect();
        for seed in 0..50 {
            let mut mem = vec![f32::NAN; 2000];
            mem[..n * e].copy_from_slice(&init);
            run(&mut mem, &steps, seed);
            for m in 0..n {
                let got = &mem[m * e..(m + 1) * e];
                assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "seed {seed} member {m}");
            }
        }
    }

    #[test]
    fn reduce_scatter_and_all_gather_place_slices_by_rank() {
        let (n, e) = (2usize, 8usize);
        let members: Vec<Member> = (0..n)
            .map(|m| Member { input: (m * e) as u64, output: (100 + m * e) as u64, scratch: (200 + m * e) as u64 })
            .collect();
        let init = values(n * e, 3);
        let rs = plan(CollKind::ReduceScatter, &members, e, 1).unwrap();
        let mut mem = vec![f32::NAN; 400];
        mem[..n * e].copy_from_slice(&init);
        run(&mut mem, &rs, 1);
        let k = e / n;
        for m in 0..n {
            for i in 0..k {
                assert_eq!(mem[100 + m * e + i], init[m * k + i] + init[e + m * k + i], "member {m} element {i}");
            }
        }
        // All-gather in place: member m's slice already sits at its place in its output.
        let members: Vec<Member> = (0..n)
            .map(|m| Member {
                input: (m * n * e + m * e) as u64,
                output: (m * n * e) as u64,
                scratch: (300 + m * n * e) as u64,
            })
            .collect();
        let ag = plan(CollKind::AllGather, &members, e, 1).unwrap();
        for seed in 0..20 {
            let mut mem = vec![0f32; 400];
            let slices = values(n * e, 9);
            for m in 0..n {
                mem[m * n * e + m * e..][..e].copy_from_slice(&slices[m * e..(m + 1) * e]);
            }
            run(&mut mem, &ag, seed);
            for m in 0..n {
                assert_eq!(&mem[m * n * e..(m + 1) * n * e], &slices[..], "seed {seed} member {m}");
            }
        }
    }

    #[test]
    fn without_the_read_done_barrier_an_in_place_all_reduce_goes_wrong() {
        // The test above would pass for a protocol without phase two only by luck: drop the
        // read-done waits and some interleaving overwrites an input another member still reads.
        let (n, e) = (3usize, 5usize);
        let members: Vec<Member> = (0..n)
            .map(|m| Member { input: (m * e) as u64, output: (m * e) as u64, scratch: (100 + m * e) as u64 })
            .collect();
        let steps: Vec<Vec<Step>> = plan(CollKind::AllReduce, &members, e, 1)
            .unwrap()
            .into_iter()
            .map(|s| s.into_iter().filter(|x| !matches!(x, Step::Wait(Ev::ReadDone(_)))).collect())
            .collect();
        let init = values(n * e, 5);
        let want: Vec<f32> = (0..e).map(|i| (1..n).fold(init[i], |acc, r| acc + init[r * e + i])).collect();
        let wrong = (0..50).any(|seed| {
            let mut mem = vec![f32::NAN; 200];
            mem[..n * e].copy_from_slice(&init);
            run(&mut mem, &steps, seed);
            (0..n).any(|m| mem[m * e..(m + 1) * e] != want[..])
        });
        assert!(wrong, "the interleavings never exposed the race: the test could not fail");
    }

    #[test]
    fn unsupported_collectives_and_uneven_splits_are_errors() {
        let m = [Member { input: 0, output: 0, scratch: 8 }; 2];
        assert!(plan(CollKind::AllToAll, &m, 4, 4).unwrap_err().contains("shared-GPU communicator is not built"));
        assert!(plan(CollKind::ReduceScatter, &m, 5, 4).unwrap_err().contains("5 elements over 2"));
        assert!(plan(CollKind::AllReduce, &[], 4, 4).is_err());
    }

    #[test]
    fn segments_sum_as_one_collective_each_with_one_barrier() {
        // Two segments (a bucket's two units) of 3 and 4 elements, over 3 members.
        let (n, lens) = (3usize, [3usize, 4]);
        let segs: Vec<Vec<Member>> = (0..2)
            .map(|s| {
                (0..n)
                    .map(|m| {
                        let at = (m * 10 + s * 5) as u64;
                        Member { input: at, output: at, scratch: 100 + at }
                    })
                    .collect()
            })
            .collect();
        let steps = plan_segments(CollKind::AllReduce, &segs, &lens, 1).unwrap();
        for (m, s) in steps.iter().enumerate() {
            assert_eq!(s.iter().filter(|x| matches!(x, Step::Record(_))).count(), 1, "member {m}");
            assert_eq!(s.iter().filter(|x| matches!(x, Step::Wait(_))).count(), 2 * (n - 1), "member {m}");
        }
        let init = values(40, 11);
        for seed in 0..30 {
            let mut mem = vec![f32::NAN; 200];
            mem[..40].copy_from_slice(&init);
            run(&mut mem, &steps, seed);
            for (s, &len) in lens.iter().enumerate() {
                for i in 0..len {
                    let want = (1..n).fold(init[s * 5 + i], |a, r| a + init[r * 10 + s * 5 + i]);
                    for m in 0..n {
                        assert_eq!(mem[m * 10 + s * 5 + i].to_bits(), want.to_bits(), "seed {seed} seg {s} member {m}");
                    }
                }
            }
        }
        assert!(plan_segments(CollKind::AllReduce, &[segs[0].clone(), segs[1][..2].to_vec()], &lens, 1).is_err());
    }

    #[test]
    fn uneven_shards_reduce_scatter_and_all_gather_in_place() {
        // 3 members over a buffer of 10 elements each, shards of 4, 4 and 2 in two pieces
        // each (the way a bucket's owned part crosses units).
        let parts: Vec<Vec<(u64, usize)>> = vec![vec![(0, 3), (5, 1)], vec![(3, 2), (6, 2)], vec![(8, 2)]];
        let bases: Vec<Ptr> = (0..3).map(|m| (m * 10) as u64).collect();
        let scratch: Vec<Ptr> = (0..3).map(|m| (100 + m * 10) as u64).collect();
        let init = values(30, 21);
        let rs = plan_parts(true, &bases, &bases, &scratch, &parts, 1);
        for seed in 0..30 {
            let mut mem = vec![f32::NAN; 200];
            mem[..30].copy_from_slice(&init);
            run(&mut mem, &rs, seed);
            for (m, ps) in parts.iter().enumerate() {
                for &(off, e) in ps {
                    for i in off as usize..off as usize + e {
                        let want = init[i] + init[10 + i] + init[20 + i];
                        assert_eq!(mem[m * 10 + i].to_bits(), want.to_bits(), "seed {seed} member {m} element {i}");
                    }
                }
            }
        }
        // All-gather: member m's own parts hold its values; afterwards every member holds all.
        let ag = plan_parts(false, &bases, &bases, &scratch, &parts, 1);
        assert_eq!(parts_scratch(false, &parts, 2), 8);
        for seed in 0..30 {
            let mut mem = vec![f32::NAN; 200];
            for (m, ps) in parts.iter().enumerate() {
                for &(off, e) in ps {
                    for i in off as usize..off as usize + e {
                        for r in 0..3 {
                            // Stale values elsewhere, the owner's value in its part.
                            mem[r * 10 + i] = if r == m { init[i] } else { -1.0 };
                        }
                    }
                }
            }
            run(&mut mem, &ag, seed);
            for r in 0..3 {
                assert_eq!(&mem[r * 10..r * 10 + 10], &init[..10], "seed {seed} member {r}");
            }
        }
    }
}
