//! The network as measured on the CPU executor's communicator (`strata calibrate`): no
//! wires, no topology — communication is work the ranks' own threads do, plus the time a
//! waiting thread takes to notice a message.
//!
//! The in-process communicator moves a collective's data with the ranks' cores: each member
//! *posts* (shares its contribution with every other member — a pointer handed over, no
//! copy) and, once every contribution is in, *finishes* (reads the others' buffers and sums
//! them in group order, or concatenates them). So a request of S bytes over n ranks costs
//!
//! - each member, on its own thread: post work P(kind, n, S) before it has arrived, and
//!   finish work F(kind, n, S) after the transfer — CPU work that the engine runs under its
//!   processor sharing like compute (see [`Network::host_work`]);
//! - the transfer itself: the latency α(kind, n) from the last arrival until the members
//!   notice (a blocked thread waking), which is all [`Network::start`] schedules;
//! - memory: nothing beyond the plan's buffers — a member reads the others' contributions
//!   where they are, and writes the result into its own output buffer, which the plan
//!   holds.
//!
//! P and F are tabulated at measured sizes and interpolated linearly in S (beyond the range,
//! extrapolated from the nearest two sizes, never below 0); a group size between two
//! measured ones interpolates linearly in n; outside, the nearest is used. `all-to-all`
//! and the ring exchange (context parallelism's) use their own lines when the profile has
//! them, else all-gather's and a pipeline message's ([`CommFitKind::fallback`], profiles
//! measured before those kinds were). Nothing is shared between requests,
//! so they never slow each other here (their work competes for cores in the engine), and
//! `multiplicity` changes nothing.
//!
//! Units: ns (u64) outside, seconds and bytes inside.

use strata_models::plan::CollKind;

use super::{CommChoice, CommId, CommKind, CommRequest, FixedTimes, HostWork, NetError, Network};
use crate::profile::{CommFit, CommFitKind, NetworkParams};

/// One (kind, group size) line: α and the work tables, seconds.
#[derive(Clone, Debug)]
struct Line {
    ranks: u32,
    alpha_s: f64,
    bytes: Vec<f64>,
    post_s: Vec<f64>,
    finish_s: Vec<f64>,
}

/// The measured network of one host.
#[derive(Clone, Debug)]
pub struct CalibratedNetwork {
    /// Per kind (index of [`CommFitKind::ALL`]), sorted by ranks.
    lines: [Vec<Line>; CommFitKind::ALL.len()],
    /// Pending completions, ordered by (time, id).
    pending: FixedTimes,
}

fn kind_of(k: CommKind) -> CommFitKind {
    match k {
        CommKind::Collective(CollKind::AllReduce) => CommFitKind::AllReduce,
        CommKind::Collective(CollKind::ReduceScatter) => CommFitKind::ReduceScatter,
        CommKind::Collective(CollKind::AllGather) => CommFitKind::AllGather,
        CommKind::Collective(CollKind::Broadcast) => CommFitKind::Broadcast,
        CommKind::Collective(CollKind::AllToAll) => CommFitKind::AllToAll,
        CommKind::Collective(CollKind::RingExchange) => CommFitKind::RingExchange,
        CommKind::SendRecv => CommFitKind::SendRecv,
    }
}

/// y at x on the polyline through (xs, ys) (xs ascending), extended linearly from the
/// nearest two points, never below 0.
fn polyline(xs: &[f64], ys: &[f64], x: f64) -> f64 {
    debug_assert!(!xs.is_empty() && xs.len() == ys.len());
    if xs.len() == 1 {
        return ys[0] * if xs[0] > 0.0 { x / xs[0] } else { 1.0 };
    }
    let i = xs.partition_point(|v| *v < x).clamp(1, xs.len() - 1);
    let (x0, x1, y0, y1) = (xs[i - 1], xs[i], ys[i - 1], ys[i]);
    (y0 + (y1 - y0) * (x - x0) / (x1 - x0)).max(0.0)
}

impl Line {
    fn from_fit(f: &CommFit) -> Line {
        Line {
            ranks: f.ranks,
            alpha_s: f.latency_us * 1e-6,
            bytes: f.bytes.iter().map(|b| *b as f64).collect(),
            post_s: f.post_us.iter().map(|v| v * 1e-6).collect(),
            finish_s: f.finish_us.iter().map(|v| v * 1e-6).collect(),
        }
    }

    /// (α, post, finish) seconds at S bytes.
    fn at(&self, bytes: f64) -> (f64, f64, f64) {
        (self.alpha_s, polyline(&self.bytes, &self.post_s, bytes), polyline(&self.bytes, &self.finish_s, bytes))
    }
}

impl CalibratedNetwork {
    /// The network of a profile's `[network]` table; every kind needs a line but the
    /// optional ones, which fall back to another kind's.
    pub fn new(params: &NetworkParams) -> Result<CalibratedNetwork, NetError> {
        let mut lines: [Vec<Line>; CommFitKind::ALL.len()] = Default::default();
        for f in &params.links {
            if f.bytes.is_empty() || f.post_us.len() != f.bytes.len() || f.finish_us.len() != f.bytes.len() {
                return Err(NetError::Cluster(format!(
                    "the profile's [network] line for {} over {} ranks has no sizes, or not one post and one finish \
                     time per size; run strata calibrate again",
                    f.kind.key(),
                    f.ranks
                )));
            }
            lines[f.kind as usize].push(Line::from_fit(f));
        }
        for kind in CommFitKind::ALL {
            if let Some(other) = kind.fallback().filter(|_| lines[kind as usize].is_empty()) {
                lines[kind as usize] = lines[other as usize].clone();
            }
        }
        for (i, v) in lines.iter_mut().enumerate() {
            if v.is_empty() {
                return Err(NetError::Cluster(format!(
                    "the profile's [network] has no {} line; run strata calibrate again",
                    CommFitKind::ALL[i].key()
                )));
            }
            v.sort_by_key(|l| l.ranks);
            v.dedup_by_key(|l| l.ranks);
        }
        Ok(CalibratedNetwork { lines, pending: FixedTimes::default() })
    }

    /// (α, post, finish) seconds for `kind` over `n` ranks at S bytes.
    fn parts(&self, kind: CommFitKind, n: u32, bytes: u64) -> (f64, f64, f64) {
        let v = &self.lines[kind as usize];
        let s = bytes as f64;
        let above = v.partition_point(|l| l.ranks < n);
        match (above.checked_sub(1).map(|i| &v[i]), v.get(above)) {
            (_, Some(hi)) if hi.ranks == n => hi.at(s),
            (Some(lo), Some(hi)) => {
                let w = (n - lo.ranks) as f64 / (hi.ranks - lo.ranks) as f64;
                let (a, b) = (lo.at(s), hi.at(s));
                (a.0 + w * (b.0 - a.0), a.1 + w * (b.1 - a.1), a.2 + w * (b.2 - a.2))
            }
            (Some(lo), None) => lo.at(s),
            (None, Some(hi)) => hi.at(s),
            (None, None) => unreachable!("every kind has a line (checked in new)"),
        }
    }

    /// A request alone, on idle cores: post + latency + finish, ns (0 for a group of one).
    pub fn cost_ns(&self, req: &CommRequest) -> u64 {
        if req.ranks.len() <= 1 {
            return 0;
        }
        let (a, p, f) = self.parts(kind_of(req.kind), req.ranks.len() as u32, req.bytes);
        ((a + p + f) * 1e9).ceil() as u64
    }
}

impl Network for CalibratedNetwork {
    fn name(&self) -> &'static str {
        "calibrated"
    }

    fn start(&mut self, now_ns: u64, req: &CommRequest) -> CommId {
        let latency = if req.ranks.len() <= 1 {
            0
        } else {
            (self.parts(kind_of(req.kind), req.ranks.len() as u32, req.bytes).0 * 1e9).ceil() as u64
        };
        self.pending.start(now_ns + latency)
    }

    fn next_completion_ns(&self) -> Option<u64> {
        self.pending.next_completion_ns()
    }

    fn advance(&mut self, now_ns: u64) -> Vec<CommId> {
        self.pending.advance(now_ns)
    }

    fn choice(&self, req: &CommRequest) -> CommChoice {
        let algorithm = if req.kind == CommKind::SendRecv { "p2p" } else { "direct" };
        CommChoice { algorithm: algorithm.to_string(), protocol: "threads".to_string(), channels: 1 }
    }

    fn host_work(&self, req: &CommRequest) -> Option<HostWork> {
        if req.ranks.len() <= 1 {
            return Some(HostWork::default());
        }
        let (_, p, f) = self.parts(kind_of(req.kind), req.ranks.len() as u32, req.bytes);
        Some(HostWork { post_ns: (p * 1e9).ceil() as u64, finish_ns: (f * 1e9).ceil() as u64 })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(kind: CommFitKind, ranks: u32, latency_us: f64, post: [f64; 2], finish: [f64; 2]) -> CommFit {
        CommFit {
            kind,
            ranks,
            latency_us,
            bytes: vec![1_000, 1_000_000],
            post_us: post.to_vec(),
            finish_us: finish.to_vec(),
        }
    }

    fn params() -> NetworkParams {
        let mut links: Vec<CommFit> = CommFitKind::ALL
            .iter()
            .filter(|k| k.fallback().is_none())
            .map(|&kind| line(kind, 2, 10.0, [1.0, 100.0], [2.0, 200.0]))
            .collect();
        links.push(line(CommFitKind::AllReduce, 8, 40.0, [7.0, 700.0], [8.0, 800.0]));
        NetworkParams { source: "test".into(), links }
    }

    fn req(kind: CommKind, n: u32, bytes: u64) -> CommRequest {
        CommRequest { kind, ranks: (0..n).collect(), bytes, multiplicity: 1 }
    }

    #[test]
    fn work_is_interpolated_in_size_and_group_and_latency_is_the_transfer() {
        let net = CalibratedNetwork::new(&params()).unwrap();
        let ar = CommKind::Collective(CollKind::AllReduce);
        let near = |got: u64, want: f64| assert!((got as f64 - want).abs() <= 1.0, "{got} vs {want}");
        // Between the measured sizes: on the line through them (1 µs at 1 kB, 100 µs at 1 MB).
        let w = net.host_work(&req(ar, 2, 500_500)).unwrap();
        near(w.post_ns, 50_500.0);
        near(w.finish_ns, 101_000.0);
        // Beyond: extended from the last two sizes.
        near(net.host_work(&req(ar, 2, 2_000_000)).unwrap().post_ns, 100_000.0 + 99_000.0 * 1e6 / 999_000.0);
        // n = 4 is a third of the way from 2 to 8.
        let w = net.host_work(&req(ar, 4, 1_000_000)).unwrap();
        near(w.post_ns, 300_000.0);
        // The transfer is the latency alone; alone on idle cores, post + latency + finish.
        let mut n = CalibratedNetwork::new(&params()).unwrap();
        n.start(0, &req(ar, 8, 1_000_000));
        assert_eq!(n.next_completion_ns(), Some(40_000));
        near(net.cost_ns(&req(ar, 8, 1_000_000)), 40_000.0 + 700_000.0 + 800_000.0);
        // A group of one costs nothing.
        assert_eq!(net.cost_ns(&req(ar, 1, 1 << 20)), 0);
    }

    #[test]
    fn a_missing_kind_is_an_error_that_says_what_to_do() {
        let mut p = params();
        assert!(CalibratedNetwork::new(&p).is_ok(), "all-to-all and the ring exchange fall back");
        // A ring exchange takes a message's line when it has none, its own when it has one.
        let ring = |p: &NetworkParams| {
            let r = req(CommKind::Collective(CollKind::RingExchange), 2, 1_000_000);
            CalibratedNetwork::new(p).unwrap().host_work(&r).unwrap().post_ns
        };
        assert_eq!(ring(&p), 100_000);
        let mut own = p.clone();
        own.links.push(line(CommFitKind::RingExchange, 2, 10.0, [1.0, 30.0], [2.0, 60.0]));
        assert_eq!(ring(&own), 30_000);
        p.links.retain(|l| l.kind != CommFitKind::Broadcast);
        let e = CalibratedNetwork::new(&p).unwrap_err().to_string();
        assert!(e.contains("broadcast") && e.contains("strata calibrate"), "{e}");
    }

    #[test]
    fn requests_complete_in_time_then_id_order() {
        let mut net = CalibratedNetwork::new(&params()).unwrap();
        let r = req(CommKind::SendRecv, 2, 0);
        let a = net.start(5, &r);
        let b = net.start(0, &r);
        assert_eq!(net.next_completion_ns(), Some(10_000));
        assert_eq!(net.advance(10_000), vec![b]);
        assert_eq!(net.advance(10_005), vec![a]);
        assert_eq!(net.next_completion_ns(), None);
    }
}
