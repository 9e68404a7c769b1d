//! `--inject SPEC`: the faults a supervised run injects, parsed and checked against the job.
//!
//! ```text
//! kill:rank=R,step=S      rank R vanishes at the start of step S, as a killed process does
//! hang:rank=R,step=S      rank R stops talking at the start of step S (noticed by --timeout)
//! slow:rank=R,factor=F    rank R computes F× slower: after each compute op it sleeps
//!                         (F − 1) × the op's measured duration, 1 ≤ F ≤ MAX_SLOW_FACTOR
//! ```
//!
//! A kill or a hang is armed in the first attempt only: it fires once, and a restarted
//! attempt runs clean (a replaced node does not die at the same step again). So a run takes
//! at most one kill or hang. A slow rank stays slow in every attempt (a restart on the same
//! hardware keeps the straggler). Every value is checked against the job before any rank
//! starts: the rank must exist, the step must be one the run executes, the factor must be
//! in range; an error names the spec, the rule and what to pass instead.

use thiserror::Error;

use crate::train::Fault;

/// The largest slowdown `slow:…,factor=F` takes: a rank 100× slower already turns a
/// one-second step into minutes; more only makes the run wait.
pub const MAX_SLOW_FACTOR: f64 = 100.0;
/// At most this many `--inject` specs (one per rank of a small job is plenty).
pub const MAX_INJECTIONS: usize = 64;

/// One injected fault, as the user wrote it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Injection {
    Kill { rank: u32, step: u32 },
    Hang { rank: u32, step: u32 },
    Slow { rank: u32, factor: f64 },
}

#[derive(Debug, Error, PartialEq)]
#[error("--inject {spec}: {what}")]
pub struct InjectError {
    pub spec: String,
    pub what: String,
}

const FORMS: &str = "kill:rank=R,step=S, hang:rank=R,step=S or slow:rank=R,factor=F";

impl Injection {
    /// Parses one `--inject` value (syntax only; [`check`] checks it against the job).
    pub fn parse(spec: &str) -> Result<Injection, InjectError> {
        let bad = |what: String| InjectError { spec: spec.to_string(), what };
        let (kind, rest) = spec.split_once(':').ok_or_else(|| bad(format!("expected {FORMS}")))?;
        let want: &[&str] = match kind {
            "kill" | "hang" => &["rank", "step"],
            "slow" => &["rank", "factor"],
            other => return Err(bad(format!("unknown fault {other:?}; the faults are {FORMS}"))),
        };
        let mut values: Vec<Option<&str>> = vec![None; want.len()];
        for pair in rest.split(',') {
            let (k, v) = pair
                .split_once('=')
                .ok_or_else(|| bad(format!("{pair:?} is not KEY=VALUE; expected {kind}:{}", form(want))))?;
            let i = want
                .iter()
                .position(|w| *w == k.trim())
                .ok_or_else(|| bad(format!("unknown key {:?}; {kind} takes {}", k.trim(), form(want))))?;
            if values[i].replace(v.trim()).is_some() {
                return Err(bad(format!("{} given twice", want[i])));
            }
        }
        let get =
            |i: usize| values[i].ok_or_else(|| bad(format!("{} missing; expected {kind}:{}", want[i], form(want))));
        let int = |i: usize| -> Result<u32, InjectError> {
            let v = get(i)?;
            v.parse().map_err(|_| bad(format!("{}={v} is not a whole number ≥ 0", want[i])))
        };
        let rank = int(0)?;
        Ok(match kind {
            "kill" => Injection::Kill { rank, step: int(1)? },
            "hang" => Injection::Hang { rank, step: int(1)? },
            _ => {
                let v = get(1)?;
                let factor: f64 = v.parse().map_err(|_| bad(format!("factor={v} is not a number")))?;
                if !(1.0..=MAX_SLOW_FACTOR).contains(&factor) {
                    return Err(bad(format!(
                        "factor={v} is outside 1 ≤ F ≤ {MAX_SLOW_FACTOR} (F is how many times slower the rank computes: 1 = not slowed; a rank cannot be made faster)"
                    )));
                }
                Injection::Slow { rank, factor }
            }
        })
    }

    pub fn rank(&self) -> u32 {
        match *self {
            Injection::Kill { rank, .. } | Injection::Hang { rank, .. } | Injection::Slow { rank, .. } => rank,
        }
    }

    /// The step it fires at (none for a slow rank: it is slow throughout).
    pub fn step(&self) -> Option<u32> {
        match *self {
            Injection::Kill { step, .. } | Injection::Hang { step, .. } => Some(step),
            Injection::Slow { .. } => None,
        }
    }

    /// The executor's fault.
    pub fn fault(&self) -> Fault {
        match *self {
            Injection::Kill { rank, step } => Fault::Exit { rank, step },
            Injection::Hang { rank, step } => Fault::Silent { rank, step },
            Injection::Slow { rank, factor } => Fault::Slow { rank, factor },
        }
    }

    /// The spec as `--inject` takes it.
    pub fn spec(&self) -> String {
        match *self {
            Injection::Kill { rank, step } => format!("kill:rank={rank},step={step}"),
            Injection::Hang { rank, step } => format!("hang:rank={rank},step={step}"),
            Injection::Slow { rank, factor } => format!("slow:rank={rank},factor={factor}"),
        }
    }
}

fn form(keys: &[&str]) -> String {
    keys.iter().map(|k| format!("{k}={}", k[..1].to_uppercase())).collect::<Vec<_>>().join(",")
}

/// Checks the injections against a job of `ranks` ranks that runs steps `start..steps`.
pub fn check(inject: &[Injection], ranks: u32, start: u32, steps: u32) -> Result<(), InjectError> {
    let bad = |i: &Injection, what: String| InjectError { spec: i.spec(), what };
    if inject.len() > MAX_INJECTIONS {
        let first = inject.first().map_or_else(String::new, Injection::spec);
        return Err(InjectError {
            spec: first,
            what: format!("{} faults injected; at most {MAX_INJECTIONS}", inject.len()),
        });
    }
    for (n, i) in inject.iter().enumerate() {
        if i.rank() >= ranks {
            let what = format!("rank {} does not exist: the job has {ranks} ranks (0–{})", i.rank(), ranks - 1);
            return Err(bad(i, what));
        }
        if let Some(step) = i.step()
            && !(start..steps).contains(&step)
        {
            let what = if step >= steps {
                format!("step {step} is beyond the run, which executes steps {start}–{}", steps.saturating_sub(1))
            } else {
                format!("step {step} is before the resumed run's first step {start}")
            };
            return Err(bad(i, what));
        }
        let earlier = &inject[..n];
        if i.step().is_some()
            && let Some(other) = earlier.iter().find(|o| o.step().is_some())
        {
            return Err(bad(
                i,
                format!(
                    "a run takes one kill or hang (faults fire in the first attempt only, and the first one ends it); {} is already injected",
                    other.spec()
                ),
            ));
        }
        if matches!(i, Injection::Slow { .. })
            && earlier.iter().any(|o| matches!(o, Injection::Slow { .. }) && o.rank() == i.rank())
        {
            return Err(bad(i, format!("rank {} is slowed twice; give one factor per rank", i.rank())));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_and_round_trip() {
        for (spec, want) in [
            ("kill:rank=3,step=7", Injection::Kill { rank: 3, step: 7 }),
            ("kill:step=7,rank=3", Injection::Kill { rank: 3, step: 7 }),
            ("hang:rank=0,step=1", Injection::Hang { rank: 0, step: 1 }),
            ("slow:rank=1,factor=2", Injection::Slow { rank: 1, factor: 2.0 }),
            ("slow:rank=1,factor=1.5", Injection::Slow { rank: 1, factor: 1.5 }),
        ] {
            let got = Injection::parse(spec).unwrap();
            assert_eq!(got, want, "{spec}");
            assert_eq!(Injection::parse(&got.spec()).unwrap(), want);
        }
    }

    #[test]
    fn malformed_specs_name_the_value_and_the_rule() {
        for (spec, words) in [
            ("kill", &["expected kill:rank=R,step=S"][..]),
            ("boom:rank=1,step=2", &["unknown fault \"boom\""]),
            ("kill:rank=1", &["step missing"]),
            ("kill:rank=1,step=2,rank=3", &["rank given twice"]),
            ("kill:rank=-1,step=2", &["rank=-1 is not a whole number"]),
            ("kill:rank=1,step", &["\"step\" is not KEY=VALUE"]),
            ("kill:rank=1,factor=2", &["unknown key \"factor\"", "rank=R,step=S"]),
            ("slow:rank=1,factor=0", &["factor=0 is outside 1 ≤ F ≤ 100"]),
            ("slow:rank=1,factor=-2", &["factor=-2 is outside"]),
            ("slow:rank=1,factor=0.5", &["cannot be made faster"]),
            ("slow:rank=1,factor=NaN", &["factor=NaN is outside"]),
            ("slow:rank=1,factor=1e9", &["factor=1e9 is outside"]),
            ("slow:rank=1,factor=x", &["factor=x is not a number"]),
        ] {
            let e = Injection::parse(spec).unwrap_err().to_string();
            assert!(e.starts_with(&format!("--inject {spec}: ")), "{e}");
            for w in words {
                assert!(e.contains(w), "{spec}: {e} lacks {w:?}");
            }
        }
    }

    #[test]
    fn checks_against_the_job_name_the_rank_and_the_step() {
        let p = |s: &str| Injection::parse(s).unwrap();
        assert!(check(&[p("kill:rank=7,step=9"), p("slow:rank=1,factor=2")], 8, 0, 10).is_ok());
        let e = check(&[p("kill:rank=8,step=1")], 8, 0, 10).unwrap_err().to_string();
        assert!(e.contains("rank 8 does not exist: the job has 8 ranks (0–7)"), "{e}");
        let e = check(&[p("kill:rank=1,step=10")], 8, 0, 10).unwrap_err().to_string();
        assert!(e.contains("step 10 is beyond the run, which executes steps 0–9"), "{e}");
        let e = check(&[p("hang:rank=1,step=2")], 8, 5, 10).unwrap_err().to_string();
        assert!(e.contains("step 2 is before the resumed run's first step 5"), "{e}");
        let e = check(&[p("kill:rank=1,step=2"), p("kill:rank=2,step=3")], 8, 0, 10).unwrap_err().to_string();
        assert!(e.contains("one kill or hang") && e.contains("kill:rank=1,step=2 is already injected"), "{e}");
        let e = check(&[p("slow:rank=2,factor=2"), p("slow:rank=2,factor=3")], 8, 0, 10).unwrap_err().to_string();
        assert!(e.contains("rank 2 is slowed twice"), "{e}");
    }
}
