//! What-ifs for one simulated step: slow ranks (`[faults] slow`), degraded links
//! (`[faults] degrade`) and links or switches that are down (`[faults] down`), their limits,
//! and the command-line forms `strata simulate` accepts (`--slow rank=17:1.3`,
//! `--degrade link=leaf2-spine7:0.5`, `--down spine3`).
//!
//! - A **slow rank** at factor f runs every compute op f times as long (thermal throttling,
//!   a slow HBM stack, a noisy neighbour): f in (0, [`SLOW_FACTOR_MAX`]]; f < 1 is a faster
//!   rank, allowed for what-ifs.
//! - A **degraded link** carries f of its bandwidth, f in (0, 1]: a link that trained down
//!   (an HDR port at 4x running 2x is f = 0.5), or a flapping one on average.
//! - A link or switch that is **down** carries nothing; the fabric's routing goes around it.
//!
//! Ranks and factors are checked here, when a scenario is loaded (a rank must be below the
//! cluster's GPU count); link and switch names only exist once the simulator has wired the
//! fabric, so `strata_sim::net::faults` checks those (list them with
//! `strata simulate SCENARIO --list-links`).

use serde::{Deserialize, Serialize};

/// The largest slow-rank factor: a rank 100× slower is a dead rank, which is a failure
/// (`[faults.failures]`), not a straggler.
pub const SLOW_FACTOR_MAX: f64 = 100.0;

/// At most this many entries in each of `slow`, `degrade` and `down`.
pub const ENTRIES_MAX: usize = 4096;

/// Link and switch names are at most this long (the longest real one, `node131071/nic63-leaf262143`, is 26).
pub const NAME_LEN_MAX: usize = 64;

/// A straggler: rank `rank` runs its compute `factor` times slower (1.3 = 30% slower).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SlowRank {
    pub rank: u32,
    pub factor: f64,
}

/// A link (named as `strata simulate --list-links` lists them) that carries `factor` of its
/// bandwidth.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkFactor {
    pub link: String,
    pub factor: f64,
}

/// Checks the step what-ifs against a cluster of `gpus` GPUs: ranks in range and not
/// repeated, factors finite and within their ranges, names short and not repeated. Returns
/// every problem, one a line, each naming the value and the rule.
pub fn check(slow: &[SlowRank], degrade: &[LinkFactor], down: &[String], gpus: u64) -> Result<(), String> {
    let mut lines = Vec::new();
    for (key, n) in [("slow", slow.len()), ("degrade", degrade.len()), ("down", down.len())] {
        if n > ENTRIES_MAX {
            lines.push(format!("faults.{key} has {n} entries, over the limit of {ENTRIES_MAX} (see docs/limits.md)"));
        }
    }
    if !lines.is_empty() {
        return Err(lines.join("\n"));
    }
    let mut seen = std::collections::BTreeSet::new();
    for s in slow {
        if s.rank as u64 >= gpus {
            lines.push(format!(
                "faults.slow: rank {} does not exist: the cluster has {gpus} GPUs, ranks 0..{}",
                s.rank,
                gpus.saturating_sub(1)
            ));
        } else if !seen.insert(s.rank) {
            lines.push(format!("faults.slow: rank {} is listed twice; give each rank one factor", s.rank));
        }
        if let Err(e) = factor_in(s.factor, SLOW_FACTOR_MAX, false) {
            lines.push(format!("faults.slow: rank {} factor = {}: {e}", s.rank, s.factor));
        }
    }
    let mut names = std::collections::BTreeSet::new();
    for d in degrade {
        if let Err(e) = name_ok(&d.link) {
            lines.push(format!("faults.degrade: {e}"));
        } else if !names.insert(d.link.as_str()) {
            lines.push(format!("faults.degrade: link {} is listed twice; give each link one factor", d.link));
        }
        if let Err(e) = factor_in(d.factor, 1.0, true) {
            lines.push(format!("faults.degrade: link {} factor = {}: {e}", d.link, d.factor));
        }
    }
    for name in down {
        if let Err(e) = name_ok(name) {
            lines.push(format!("faults.down: {e}"));
        }
    }
    if lines.is_empty() { Ok(()) } else { Err(lines.join("\n")) }
}

/// A factor in (0, max]: finite and positive.
fn factor_in(f: f64, max: f64, fraction: bool) -> Result<(), String> {
    let what = if fraction {
        "a degraded link carries a fraction of its bandwidth, a number in (0, 1] (a link that is down goes in faults.down)"
    } else {
        "a slow rank's compute factor must be a number in (0, 100] (1.3 = 30% slower; a dead rank is a failure, not a straggler)"
    };
    if f.is_finite() && f > 0.0 && f <= max { Ok(()) } else { Err(what.to_string()) }
}

fn name_ok(name: &str) -> Result<(), String> {
    let shown: String = name.chars().take(NAME_LEN_MAX).collect();
    if name.is_empty() {
        Err("an empty link name; list the names with strata simulate SCENARIO --list-links".into())
    } else if name.chars().count() > NAME_LEN_MAX {
        Err(format!("link name {shown}… is longer than {NAME_LEN_MAX} characters; list the names with --list-links"))
    } else if !name.chars().all(|c| c.is_ascii_alphanumeric() || "/-#_".contains(c)) {
        Err(format!(
            "link name {:?} has characters no link name has (letters, digits, / - # only); list the names with --list-links",
            shown
        ))
    } else {
        Ok(())
    }
}

/// `--slow rank=17:1.3` (or `17:1.3`).
pub fn parse_slow(spec: &str) -> Result<SlowRank, String> {
    let body = spec.strip_prefix("rank=").unwrap_or(spec);
    let bad = |why: &str| format!("--slow {spec}: {why}; write --slow rank=RANK:FACTOR, e.g. --slow rank=17:1.3");
    let (rank, factor) = body.split_once(':').ok_or_else(|| bad("no ':' between the rank and the factor"))?;
    let rank = rank.trim().parse::<u32>().map_err(|_| bad(&format!("rank {rank:?} is not a rank number")))?;
    let factor = factor.trim().parse::<f64>().map_err(|_| bad(&format!("factor {factor:?} is not a number")))?;
    Ok(SlowRank { rank, factor })
}

/// `--degrade link=leaf2-spine7:0.5` (or `leaf2-spine7:0.5`); the factor after the last ':'.
pub fn parse_degrade(spec: &str) -> Result<LinkFactor, String> {
    let body = spec.strip_prefix("link=").unwrap_or(spec);
    let bad = |why: &str| {
        format!("--degrade {spec}: {why}; write --degrade link=NAME:FACTOR, e.g. --degrade link=leaf2-spine7:0.5")
    };
    let (link, factor) = body.rsplit_once(':').ok_or_else(|| bad("no ':' between the link and the factor"))?;
    let factor = factor.trim().parse::<f64>().map_err(|_| bad(&format!("factor {factor:?} is not a number")))?;
    Ok(LinkFactor { link: link.trim().to_string(), factor })
}

/// `--down link=leaf2-spine7`, `--down spine3` (a switch) or `--down switch=spine3`.
pub fn parse_down(spec: &str) -> String {
    let body = spec.strip_prefix("link=").or_else(|| spec.strip_prefix("switch=")).unwrap_or(spec);
    body.trim().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slow(rank: u32, factor: f64) -> Vec<SlowRank> {
        vec![SlowRank { rank, factor }]
    }

    #[test]
    fn ranks_and_factors_are_checked_naming_the_value() {
        assert!(check(&slow(1023, 1.3), &[], &[], 1024).is_ok());
        let e = check(&slow(1024, 1.3), &[], &[], 1024).unwrap_err();
        assert!(e.contains("rank 1024 does not exist") && e.contains("0..1023"), "{e}");
        for f in [0.0, -1.0, f64::NAN, f64::INFINITY, 101.0] {
            let e = check(&slow(3, f), &[], &[], 8).unwrap_err();
            assert!(e.contains(&format!("factor = {f}")), "{e}");
        }
        let twice = [SlowRank { rank: 2, factor: 1.1 }, SlowRank { rank: 2, factor: 1.2 }];
        assert!(check(&twice, &[], &[], 8).unwrap_err().contains("rank 2 is listed twice"));
        for f in [0.0, -0.5, 1.5, f64::NAN] {
            let d = [LinkFactor { link: "leaf0-spine1".into(), factor: f }];
            let e = check(&[], &d, &[], 8).unwrap_err();
            assert!(e.contains("link leaf0-spine1") && e.contains("(0, 1]"), "{e}");
        }
        let e = check(&[], &[], &["x".repeat(1000)], 8).unwrap_err();
        assert!(e.contains("longer than 64") && e.len() < 300, "{e}");
        let e = check(&[], &[], &["spine 3".into()], 8).unwrap_err();
        assert!(e.contains("\"spine 3\""), "{e}");
        let many = vec!["spine0".to_string(); ENTRIES_MAX + 1];
        assert!(check(&[], &[], &many, 8).unwrap_err().contains("over the limit of 4096"));
    }

    #[test]
    fn command_line_forms_parse_or_say_how_to_write_them() {
        assert_eq!(parse_slow("rank=17:1.3").unwrap(), SlowRank { rank: 17, factor: 1.3 });
        assert_eq!(parse_slow("5:2").unwrap(), SlowRank { rank: 5, factor: 2.0 });
        assert!(parse_slow("rank=x:1.3").unwrap_err().contains("rank \"x\""));
        assert!(parse_slow("rank=17").unwrap_err().contains("--slow rank=RANK:FACTOR"));
        assert!(parse_slow("rank=-1:1.3").is_err());
        let d = parse_degrade("link=node3/nic0-leaf2:0.5").unwrap();
        assert_eq!((d.link.as_str(), d.factor), ("node3/nic0-leaf2", 0.5));
        assert!(parse_degrade("link=leaf2-spine7").unwrap_err().contains("--degrade link=NAME:FACTOR"));
        assert!(parse_degrade("leaf2-spine7:half").unwrap_err().contains("\"half\""));
        assert_eq!(parse_down("switch=spine3"), "spine3");
        assert_eq!(parse_down("link=leaf0-spine1#2"), "leaf0-spine1#2");
    }
}
