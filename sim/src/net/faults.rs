//! Link what-ifs on the wired fabric: degraded links (a bandwidth factor) and links or
//! switches that are down (`[faults] degrade` / `down`, named as [`super::names`] names
//! them), applied to a [`Topology`] before anything routes over it.
//!
//! - **Degraded** link at factor f: both directions carry f·C of their capacity C.
//! - **Down** link or switch (every link touching it): it carries nothing. Routes avoid it
//!   ([`super::routing::Router`]): under *static* routing a flow whose hashed path crosses
//!   a down link is hashed again (the lane input perturbed, as a subnet manager's re-sweep
//!   moves the broken routes) until its path survives, and falls back to a shortest
//!   surviving path; flows that did not cross it keep their paths, so the moved ones
//!   collide where the hash puts them. Under *adaptive* routing the parallel links toward
//!   the next tier act as one trunk: a trunk's capacity is the sum of its surviving
//!   members' (degraded) capacities, C_trunk' = Σ_m f_m·C_m over members not down, so
//!   adaptive routing spreads over what survives. A trunk with no member left is down.
//! - If no path survives between two ranks that must talk (a NIC's only cable, a rail's
//!   only leaf), the run is refused naming the pair ([`super::FabricNetwork`] checks every
//!   communication's resources).
//!
//! Units: bytes/s.

use super::NetError;
use super::names::Index;
use super::topology::{ResId, Topology};

/// The link what-ifs of a step, as names and factors.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LinkFaults {
    pub degrade: Vec<(String, f64)>,
    pub down: Vec<String>,
}

impl LinkFaults {
    /// The link half of a scenario's `[faults]`.
    pub fn of(f: &strata_models::faults::Faults) -> LinkFaults {
        LinkFaults { degrade: f.degrade.iter().map(|d| (d.link.clone(), d.factor)).collect(), down: f.down.clone() }
    }

    pub fn is_empty(&self) -> bool {
        self.degrade.is_empty() && self.down.is_empty()
    }
}

fn unknown(key: &str, name: &str, topo: &Topology, idx: &Index) -> NetError {
    NetError::UnknownLink {
        key: key.to_string(),
        name: name.to_string(),
        fabric: topo.fabric().name().to_string(),
        count: idx.count,
        examples: idx.examples.join(", "),
    }
}

/// Applies `f` to `topo`: capacities of degraded links and of the trunks they belong to,
/// and the set of resources that are down. Unknown names are errors naming them.
pub fn apply(topo: &mut Topology, f: &LinkFaults) -> Result<(), NetError> {
    if f.is_empty() {
        return Ok(());
    }
    let idx = Index::new(topo);
    let n = topo.resources.len();
    let mut factor = vec![1.0f64; n];
    let mut down = vec![false; n];
    for (name, x) in &f.degrade {
        let res = idx.get(name).ok_or_else(|| unknown("faults.degrade", name, topo, &idx))?;
        for &r in res {
            factor[r as usize] *= x;
        }
    }
    for name in &f.down {
        let res = idx.get(name).ok_or_else(|| unknown("faults.down", name, topo, &idx))?;
        for &r in res {
            down[r as usize] = true;
        }
    }
    let orig: Vec<f64> = topo.resources.iter().map(|r| r.cap_bytes_per_s).collect();
    for (r, res) in topo.resources.iter_mut().enumerate() {
        if !down[r] {
            res.cap_bytes_per_s = orig[r] * factor[r];
        }
    }
    let trunks: Vec<(ResId, Vec<ResId>)> = topo.fabric().trunks();
    for (t, members) in trunks {
        if members.is_empty() {
            continue;
        }
        let whole: f64 = members.iter().map(|&m| orig[m as usize]).sum();
        let left: f64 =
            members.iter().filter(|&&m| !down[m as usize]).map(|&m| orig[m as usize] * factor[m as usize]).sum();
        if left <= 0.0 {
            down[t as usize] = true;
        } else {
            topo.resources[t as usize].cap_bytes_per_s = orig[t as usize] * left / whole;
        }
    }
    topo.down = down;
    Ok(())
}

#[cfg(test)]
mod tests {
    use strata_models::{ClusterSpec, Fabric, Routing};

    use super::*;
    use crate::net::routing::Router;
    use crate::net::topology::ResKind;

    fn cluster(routing: Routing) -> ClusterSpec {
        let mut c = ClusterSpec::preset("dgx-h100").unwrap();
        c.nodes = 32;
        c.fabric = Fabric::RailOptimized;
        c.routing = routing;
        c
    }

    fn faulted(c: &ClusterSpec, f: &LinkFaults) -> Result<Topology, NetError> {
        let mut t = Topology::new(c, 3)?;
        apply(&mut t, f)?;
        Ok(t)
    }

    #[test]
    fn degrade_scales_the_link_and_its_trunks() {
        let c = cluster(Routing::Adaptive);
        let clean = Topology::new(&c, 3).unwrap();
        let f = LinkFaults {
            degrade: vec![("leaf0-spine1#2".into(), 0.5), ("node0/nic0-leaf0".into(), 0.25)],
            down: vec![],
        };
        let t = faulted(&c, &f).unwrap();
        let idx = Index::new(&t);
        let [up, down] = idx.get("leaf0-spine1#2").unwrap() else { panic!() };
        let link = clean.resources[*up as usize].cap_bytes_per_s;
        assert_eq!(t.resources[*up as usize].cap_bytes_per_s, 0.5 * link);
        assert_eq!(t.resources[*down as usize].cap_bytes_per_s, 0.5 * link);
        let nic = t.nic_up(0);
        assert_eq!(t.resources[nic as usize].cap_bytes_per_s, 0.25 * clean.resources[nic as usize].cap_bytes_per_s);
        // Leaf 0's up trunk lost half a link of its 32: C_trunk' = (32 − 0.5)·C.
        let trunk =
            |t: &Topology, k| (0..t.resources.len()).find(|&r| t.resources[r].kind == ResKind::Trunk(k)).unwrap();
        let k = crate::net::topology::Tier::LeafUp;
        let r = trunk(&t, k);
        assert_eq!(t.resources[r].cap_bytes_per_s, clean.resources[r].cap_bytes_per_s * 31.5 / 32.0);
    }

    #[test]
    fn a_downed_spine_is_avoided_by_every_route() {
        for routing in [Routing::Static, Routing::Adaptive] {
            let c = cluster(routing);
            let t = faulted(&c, &LinkFaults { degrade: vec![], down: vec!["spine1".into()] }).unwrap();
            let mut r = Router::new(&t);
            for (src, dst) in [(0u32, 8u32), (1, 9), (0, 249), (7, 255)] {
                for lane in 0..16 {
                    let p = r.route(&t, t.endpoint(src / 8, src % 8), t.endpoint(dst / 8, dst % 8), lane);
                    assert!(r.path(p).res.iter().all(|&x| !t.down[x as usize]), "{routing:?} {src}->{dst} lane {lane}");
                }
            }
        }
    }

    #[test]
    fn unknown_names_are_errors_naming_them() {
        let c = cluster(Routing::Static);
        let e = faulted(&c, &LinkFaults { degrade: vec![("leaf99-spine0".into(), 0.5)], down: vec![] }).unwrap_err();
        let m = e.to_string();
        assert!(m.contains("leaf99-spine0") && m.contains("--list-links") && m.contains("faults.degrade"), "{m}");
        let e = faulted(&c, &LinkFaults { degrade: vec![], down: vec!["spine9".into()] }).unwrap_err().to_string();
        assert!(e.contains("spine9") && e.contains("faults.down"), "{e}");
    }
}
