//! Tests of the schedule tables and their closed forms: every pass once, the bubbles of
//! the papers against a unit-time execution of the tables, in-flight peaks, and each
//! [`Spec`](super::Spec) closed form against its table.

use super::*;

/// Executes the tables of all stages with fixed pass times (in units where a full
/// forward of one microbatch through one stage takes `v` chunk forwards of 1/v) and
/// returns the makespan, as exact rationals scaled by `v`·3 to stay integral.
/// Dependencies: a forward needs the same microbatch's forward on the previous virtual
/// stage; an input-gradient pass the next virtual stage's; a weight pass its own input
/// pass.
pub(crate) fn unit_makespan(schedule: Schedule, pp: u32, v: u32, m: u32, tf: u64, tb: u64, tw: u64) -> u64 {
    unit_spans(schedule, pp, v, m, tf, tb, tw).iter().map(|s| s.1).max().expect("pp > 0")
}

/// Like [`unit_makespan`], but each stage's (start of its first pass, end of its last).
pub(crate) fn unit_spans(schedule: Schedule, pp: u32, v: u32, m: u32, tf: u64, tb: u64, tw: u64) -> Vec<(u64, u64)> {
    use std::collections::BTreeMap;
    let tables: Vec<Vec<Slot>> = (0..pp).map(|i| table(schedule, pp, v, m, i)).collect();
    let mut done: BTreeMap<(u8, u32, u32), u64> = BTreeMap::new(); // (pass, mb, vstage) -> finish
    let mut clock = vec![0u64; pp as usize];
    let mut first = vec![None; pp as usize];
    let mut next = vec![0usize; pp as usize];
    let key = |pass: Pass| match pass {
        Pass::Forward => 0u8,
        Pass::Backward | Pass::BackwardInput => 1,
        Pass::BackwardWeight => 2,
    };
    let pipe = crate::plan::grid::Pipeline::new(pp, v);
    let last = pipe.last_vstage();
    loop {
        let mut progressed = false;
        for i in 0..pp as usize {
            let Some(s) = tables[i].get(next[i]) else { continue };
            let vs = pipe.vstage(s.chunk, i as u32);
            let dep = match s.pass {
                Pass::Forward => (vs > 0).then(|| (0u8, s.mb, vs - 1)),
                Pass::Backward | Pass::BackwardInput => Some(if vs < last { (1, s.mb, vs + 1) } else { (0, s.mb, vs) }),
                Pass::BackwardWeight => Some((1, s.mb, vs)),
            };
            let ready = match dep {
                None => Some(0),
                Some(d) => done.get(&d).copied(),
            };
            let own_fwd = if s.pass == Pass::Forward { Some(0) } else { done.get(&(0, s.mb, vs)).copied() };
            if let (Some(r), Some(f)) = (ready, own_fwd) {
                let dur = match s.pass {
                    Pass::Forward => tf,
                    Pass::Backward => tb + tw,
                    Pass::BackwardInput => tb,
                    Pass::BackwardWeight => tw,
                };
                let start = clock[i].max(r).max(f);
                first[i].get_or_insert(start);
                clock[i] = start + dur;
                done.insert((key(s.pass), s.mb, vs), clock[i]);
                next[i] += 1;
                progressed = true;
            }
        }
        if !progressed {
            assert!(next.iter().zip(&tables).all(|(n, t)| *n == t.len()), "schedule {schedule:?} deadlocks");
            return first.iter().zip(&clock).map(|(f, c)| (f.expect("a stage runs passes"), *c)).collect();
        }
    }
}

/// The peak over a stage's table of microbatch-chunks alive: a forward starts one, the
/// pass that frees its activations (the backward, or the weight pass when split) ends it.
fn table_peak(schedule: Schedule, pp: u32, v: u32, m: u32, stage: u32) -> u64 {
    let (mut live, mut peak) = (0u64, 0u64);
    for s in table(schedule, pp, v, m, stage) {
        match s.pass {
            Pass::Forward => live += 1,
            Pass::Backward | Pass::BackwardWeight => live -= 1,
            Pass::BackwardInput => {}
        }
        peak = peak.max(live);
    }
    peak
}

/// Shapes every schedule's closed forms are checked at: (pp, vpp, m), vpp ignored by
/// single-chunk schedules, m a multiple of pp where a schedule needs it.
fn shapes(schedule: Schedule) -> Vec<(u32, u32, u32)> {
    let mut out = Vec::new();
    for pp in [1, 2, 3, 4, 8] {
        for m in [1, 2, 3, 4, 5, 8, 9, 16, 24] {
            if schedule.chunked() {
                if pp >= 2 && m % pp == 0 {
                    out.extend([2, 3].map(|v| (pp, v, m)));
                }
            } else {
                out.push((pp, 1, m));
            }
        }
    }
    out
}

#[test]
fn in_flight_closed_forms_are_the_table_peaks() {
    for sched in Schedule::ALL {
        for (pp, v, m) in shapes(sched) {
            for i in 0..pp {
                let peak = table_peak(sched, pp, v, m, i);
                assert_eq!(sched.in_flight(pp, v, m, i), peak, "{sched:?} p={pp} v={v} m={m} stage {i}");
                if !sched.chunked() {
                    // One chunk: the embedding and head buffers live as long as the stage's
                    // activations.
                    assert_eq!(sched.edge_in_flight(pp, v, m, i), peak, "{sched:?} p={pp} m={m} stage {i}");
                }
            }
        }
    }
}

#[test]
fn splits_backward_is_read_off_the_table() {
    for sched in Schedule::ALL {
        for (pp, v, m) in shapes(sched) {
            let any_w = (0..pp).any(|i| table(sched, pp, v, m, i).iter().any(|s| s.pass == Pass::BackwardWeight));
            assert_eq!(sched.splits_backward(), any_w, "{sched:?} p={pp} v={v} m={m}");
        }
    }
}

#[test]
fn search_bubble_is_the_table_makespan_at_unit_times() {
    // With every stage alike and T_F = T_B = T_W, the estimate's bubble is exactly what the
    // tables take beyond m · (T_F + T_B + T_W) (m ≥ 2p, where every closed form holds).
    for sched in Schedule::ALL {
        for (pp, v, m) in shapes(sched).into_iter().filter(|(pp, _, m)| *m >= 2 * pp) {
            let k = 6 * v as u64;
            let times = vec![PassTimes { f: k as f64, b: k as f64, w: k as f64 }; pp as usize];
            let chunk = k / v as u64;
            let span = unit_makespan(sched, pp, v, m, chunk, chunk, chunk);
            let ideal = 3 * k * m as u64;
            let bubble = sched.bubble(pp, v, &times);
            assert!(
                (bubble - (span - ideal) as f64).abs() < 1e-9,
                "{sched:?} p={pp} v={v} m={m}: estimate {bubble}, table {}",
                span - ideal
            );
        }
    }
}

#[test]
fn labels_and_the_chunked_default() {
    assert_eq!(Schedule::Interleaved.label(2), "int2");
    assert_eq!(Schedule::OneFOneB.label(1), "1f1b");
    assert_eq!(Schedule::chunked_default(), Schedule::Interleaved);
    assert!(Schedule::ALL.iter().all(|s| s.chunked() || s.label(1) == s.key()));
}

#[test]
fn every_pass_appears_once_per_microbatch_and_chunk() {
    for (sched, pp, v, m) in [
        (Schedule::Gpipe, 4, 1, 6),
        (Schedule::OneFOneB, 4, 1, 3),
        (Schedule::OneFOneB, 4, 1, 9),
        (Schedule::Interleaved, 4, 2, 8),
        (Schedule::Interleaved, 2, 3, 2),
        (Schedule::ZbH1, 4, 1, 8),
        (Schedule::ZbH2, 4, 1, 8),
        (Schedule::ZbH2, 4, 1, 5),
    ] {
        for i in 0..pp {
            let t = table(sched, pp, v, m, i);
            let passes = if sched.splits_backward() { 3 } else { 2 };
            assert_eq!(t.len() as u32, m * v * passes, "{sched:?} stage {i}");
            for j in 0..m {
                for c in 0..v {
                    let fwd = t.iter().position(|s| s.mb == j && s.chunk == c && s.pass == Pass::Forward).unwrap();
                    let bwd = t.iter().position(|s| s.mb == j && s.chunk == c && s.pass != Pass::Forward).unwrap();
                    assert!(fwd < bwd, "{sched:?}: backward of mb {j} chunk {c} before its forward");
                }
            }
        }
    }
}

#[test]
fn bubbles_match_the_closed_forms() {
    // Times in units of 1/(3v) of a microbatch's stage forward+backward: tf = 1·k, tb = 2·k
    // (or tb = tw = 1·k split), k = 6 / v keeps everything integral.
    for (pp, m) in [(2, 4), (4, 4), (4, 8), (4, 12), (8, 16), (8, 8)] {
        for sched in [Schedule::Gpipe, Schedule::OneFOneB] {
            let span = unit_makespan(sched, pp, 1, m, 6, 6, 6);
            let ideal = 18 * m as u64;
            assert_eq!((span - ideal) * m as u64, ideal * (pp as u64 - 1), "{sched:?} p={pp} m={m}");
        }
        let zb = unit_makespan(Schedule::ZbH1, pp, 1, m, 6, 6, 6);
        let ideal = 18 * m as u64;
        // (p−1)/(3m)
        assert_eq!((zb - ideal) * 3 * m as u64, ideal * (pp as u64 - 1), "zb-h1 p={pp} m={m}");
    }
    for (pp, v, m) in [(2, 2, 4), (4, 2, 8), (4, 3, 8), (4, 2, 4), (8, 2, 16), (4, 4, 12), (2, 3, 2)] {
        let k = 12 / v as u64;
        let span = unit_makespan(Schedule::Interleaved, pp, v, m, k, k, k);
        let ideal = 36 * m as u64;
        assert_eq!((span - ideal) * (v * m) as u64, ideal * (pp as u64 - 1), "interleaved p={pp} v={v} m={m}");
    }
}

#[test]
fn zb_h1_holds_at_most_p_microbatches() {
    for (pp, m) in [(4, 8), (8, 16), (4, 3)] {
        for i in 0..pp {
            let mut live = 0i32;
            let mut peak = 0;
            for s in table(Schedule::ZbH1, pp, 1, m, i) {
                match s.pass {
                    Pass::Forward => live += 1,
                    Pass::BackwardWeight => live -= 1,
                    _ => {}
                }
                peak = peak.max(live);
            }
            assert!(peak <= pp as i32 && peak <= m as i32, "stage {i}: {peak}");
        }
    }
}

/// Qi et al.'s Figure 3 (bottom), p = 4, m = 8, microbatches from 0: the first stage runs
/// 7 forwards, then B0 W0 F7, then B W pairs; the last runs F B pairs to F6 B6, then
/// W0 F7 B7 and the remaining weight passes.
#[test]
fn zb_h2_is_the_papers_figure() {
    let text = |i| {
        let t = table(Schedule::ZbH2, 4, 1, 8, i);
        let name = |s: &Slot| {
            let p = match s.pass {
                Pass::Forward => "F",
                Pass::BackwardInput => "B",
                Pass::BackwardWeight => "W",
                Pass::Backward => "BW",
            };
            format!("{p}{}", s.mb)
        };
        t.iter().map(name).collect::<Vec<_>>().join(" ")
    };
    assert_eq!(text(0), "F0 F1 F2 F3 F4 F5 F6 B0 W0 F7 B1 W1 B2 W2 B3 W3 B4 W4 B5 W5 B6 W6 B7 W7");
    assert_eq!(text(3), "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 W0 F7 B7 W1 W2 W3 W4 W5 W6 W7");
}

/// Qi et al. §2.2: the bubble of ZB-H2 is (p−1)(T_F + T_B − 2T_W), zero at T_F = T_B =
/// T_W, counted as each stage's idle time between its first and last pass (the
/// parallelogram, with the optimizer step's synchronisation bypassed). Under a flush the
/// step also waits for the last stage's late start: (p−1)·max(T_F, T_F + T_B − 2T_W),
/// the closed form the search estimate uses. Both need m ≥ 2p − 1 (a full warm-up).
#[test]
fn zb_h2_bubble_is_the_papers_formula() {
    let mut measured = Vec::new();
    for (tf, tb, tw) in [(6u64, 6u64, 6u64), (6, 12, 6), (6, 6, 3), (6, 9, 3), (12, 6, 6), (6, 6, 12)] {
        for (pp, m) in [(2, 3), (2, 4), (3, 7), (4, 7), (4, 8), (4, 12), (8, 15), (8, 16), (8, 24)] {
            let ideal = m as u64 * (tf + tb + tw);
            let spans = unit_spans(Schedule::ZbH2, pp, 1, m, tf, tb, tw);
            let idle = spans.iter().map(|(start, end)| end - start).max().unwrap() - ideal;
            let paper = (pp as i64 - 1) * (tf as i64 + tb as i64 - 2 * tw as i64);
            assert_eq!(idle as i64, paper.max(0), "t=({tf},{tb},{tw}) p={pp} m={m}");
            let step = spans.iter().map(|s| s.1).max().unwrap() - ideal;
            assert_eq!(step as i64, paper.max((pp as i64 - 1) * tf as i64), "flush t=({tf},{tb},{tw}) p={pp} m={m}");
            let times = vec![PassTimes { f: tf as f64, b: tb as f64, w: tw as f64 }; pp as usize];
            assert_eq!(Schedule::ZbH2.bubble(pp, 1, &times), step as f64, "t=({tf},{tb},{tw}) p={pp} m={m}");
            // Never slower than ZB-H1 (same order of F and B, more room for W).
            assert!(step <= unit_makespan(Schedule::ZbH1, pp, 1, m, tf, tb, tw) - ideal);
            if tf == tb && tb == tw {
                measured.push(format!("p={pp} m={m}: span {} flush {}", ideal + idle, ideal + step));
            }
        }
    }
    println!("ZB-H2 at T_F = T_B = T_W = 6: {}", measured.join("; "));
}

/// Qi et al. §2.2: ZB-H2 holds at most 2p − 1 microbatches (its peak memory (2p−1)·M_B),
/// and the first stage reaches it once m ≥ 2p − 1.
#[test]
fn zb_h2_holds_at_most_2p_minus_1_microbatches() {
    for (pp, m) in [(2, 4), (4, 8), (4, 3), (8, 16), (8, 32)] {
        for i in 0..pp {
            assert!(table_peak(Schedule::ZbH2, pp, 1, m, i) <= (2 * pp - 1).min(m) as u64, "p={pp} m={m} stage {i}");
        }
        assert_eq!(table_peak(Schedule::ZbH2, pp, 1, m, 0), (2 * pp - 1).min(m) as u64, "p={pp} m={m}");
        assert_eq!(Schedule::ZbH2.in_flight(pp, 1, m, 0), (2 * pp - 1).min(m) as u64);
    }
}
