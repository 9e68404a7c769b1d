//! Several jobs on one fabric, against what must hold: a job alone through the multi-job
//! driver is the single-job simulation to the nanosecond; jobs that share no link do not
//! slow each other at all; jobs whose data-parallel rings share oversubscribed uplinks do,
//! by more than 1 and less than the oversubscription; the report is a function of its input.

use strata_models::plan::{self, Plan};
use strata_models::{ClusterSpec, Scenario};

use super::{JobSpec, JobsError, simulate_jobs};
use crate::engine::Mode;
use crate::net::{self, NetworkKind};
use crate::simulate::{SimOptions, simulate_with};

/// A small cluster: H100 nodes of 2 GPUs and 2 NICs, radix-8 switches (4 NIC ports, i.e. 2
/// nodes, per leaf), so that 4 nodes make 2 leaves under one spine.
fn cluster(nodes: u32, oversubscription: f64, routing: &str) -> String {
    format!(
        "[cluster]\npreset = \"dgx-h100\"\nnodes = {nodes}\ngpus_per_node = 2\nnics_per_node = 2\n\
         fabric = \"fat-tree\"\nswitch_radix = 8\noversubscription = {oversubscription}\nrouting = \"{routing}\"\n"
    )
}

/// A GPT-2 job of `nodes` nodes with TP over a node's 2 GPUs and DP over its nodes.
fn job_plan(nodes: u32, oversubscription: f64, routing: &str) -> Plan {
    let text = format!(
        "name = \"j\"\n[model]\npreset = \"gpt2-350m\"\n{}[parallel]\ntp = 2\npp = 1\ndp = {nodes}\n\
         micro_batch = 1\nglobal_batch = {}\n",
        cluster(nodes, oversubscription, routing),
        2 * nodes
    );
    let s = Scenario::from_toml(&text, "test", "j", &[]).unwrap();
    plan::lower(&s).unwrap()
}

fn shared(nodes: u32, oversubscription: f64, routing: &str) -> ClusterSpec {
    job_plan(nodes, oversubscription, routing).scenario.cluster
}

fn options() -> SimOptions {
    SimOptions { mode: Mode::Full, seed: 7, ..SimOptions::default() }
}

#[test]
fn a_job_alone_is_the_single_job_simulation() {
    let p = job_plan(2, 4.0, "static");
    let c = shared(2, 4.0, "static");
    let r = simulate_jobs(&c, &[JobSpec { name: "a".into(), plan: &p, nodes: vec![0, 1] }], &options()).unwrap();
    let mut fabric = net::build(&c, 7, NetworkKind::Fabric).unwrap();
    let single = simulate_with(&p, &options(), fabric.as_mut()).unwrap();
    let j = &r.jobs[0];
    assert_eq!(j.alone.step_time_s, single.step_time_s);
    assert_eq!(j.alone.events, single.events);
    assert_eq!(j.alone.breakdown_s, single.breakdown_s);
    // With no other job, together is alone.
    assert_eq!(j.together, j.alone);
    assert_eq!(j.slowdown, 1.0);
}

#[test]
fn jobs_on_disjoint_nodes_with_intra_node_traffic_do_not_slow_down() {
    // One node each: TP over NVLink, no DP, so nothing crosses the fabric.
    let p = job_plan(1, 4.0, "static");
    let c = shared(4, 4.0, "static");
    let jobs = [
        JobSpec { name: "a".into(), plan: &p, nodes: vec![0] },
        JobSpec { name: "b".into(), plan: &p, nodes: vec![2] },
    ];
    let r = simulate_jobs(&c, &jobs, &options()).unwrap();
    for j in &r.jobs {
        assert_eq!(j.together, j.alone, "job {}", j.name);
        assert_eq!(j.slowdown, 1.0);
    }
}

#[test]
fn packed_jobs_share_no_link_and_interleaved_ones_contend() {
    let p = job_plan(2, 4.0, "adaptive");
    let c = shared(4, 4.0, "adaptive");
    // Packed: each job on the two nodes of one leaf; its DP ring never leaves the leaf.
    let packed = [
        JobSpec { name: "a".into(), plan: &p, nodes: vec![0, 1] },
        JobSpec { name: "b".into(), plan: &p, nodes: vec![2, 3] },
    ];
    let r = simulate_jobs(&c, &packed, &options()).unwrap();
    for j in &r.jobs {
        assert_eq!(j.slowdown, 1.0, "packed job {}", j.name);
    }
    // Interleaved: each job has one node on each leaf, so both jobs' rings cross the
    // leaves' 4:1 oversubscribed uplinks at once.
    let inter = [
        JobSpec { name: "a".into(), plan: &p, nodes: vec![0, 2] },
        JobSpec { name: "b".into(), plan: &p, nodes: vec![1, 3] },
    ];
    let r = simulate_jobs(&c, &inter, &options()).unwrap();
    for j in &r.jobs {
        assert!(j.slowdown > 1.0 + 1e-3, "interleaved job {} slowdown {}", j.name, j.slowdown);
        assert!(j.slowdown < 4.0, "job {} slowdown {} over the oversubscription", j.name, j.slowdown);
        // The extra time is communication that the sharing lengthened: it cannot exceed
        // the exposed communication of the shared step.
        let extra = j.together.step_time_s - j.alone.step_time_s;
        let b = &j.together.breakdown_s;
        let comm = b.dp_exposed + b.tp_exposed + b.pp_exposed;
        assert!(extra <= comm + 1e-9, "job {}: extra {extra} s beyond exposed comm {comm} s", j.name);
    }
    // Identical jobs in mirrored places see the same slowdown.
    assert_eq!(r.jobs[0].together.step_time_s, r.jobs[1].together.step_time_s);
}

#[test]
fn static_routing_contention_is_deterministic() {
    let p = job_plan(2, 2.0, "static");
    let c = shared(4, 2.0, "static");
    let inter = [
        JobSpec { name: "a".into(), plan: &p, nodes: vec![0, 2] },
        JobSpec { name: "b".into(), plan: &p, nodes: vec![3, 1] },
    ];
    let a = serde_json::to_string(&simulate_jobs(&c, &inter, &options()).unwrap()).unwrap();
    let b = serde_json::to_string(&simulate_jobs(&c, &inter, &options()).unwrap()).unwrap();
    assert_eq!(a, b);
}

#[test]
fn bad_placements_are_refused_naming_the_job_and_node() {
    let p = job_plan(2, 1.0, "adaptive");
    let c = shared(4, 1.0, "adaptive");
    let cases: [(&[u32], &[u32], &str); 3] = [
        (&[0, 1], &[1, 2], "node 1 is placed twice (overlaps job a)"),
        (&[0, 1], &[2, 4], "node 4 is outside the cluster (nodes 0-3)"),
        (&[0, 1], &[2], "its plan has 4 ranks but its 1 nodes hold 2 GPUs"),
    ];
    for (a, b, want) in cases {
        let jobs = [
            JobSpec { name: "a".into(), plan: &p, nodes: a.to_vec() },
            JobSpec { name: "b".into(), plan: &p, nodes: b.to_vec() },
        ];
        let e = simulate_jobs(&c, &jobs, &options()).unwrap_err();
        assert!(matches!(&e, JobsError::Placement { job, .. } if job == "b"), "{e}");
        assert!(e.to_string().contains(want), "{e}");
    }
}
