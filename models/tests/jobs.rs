//! Multi-job files: placements in their three spellings, a job's scenario from a file with
//! the job's own keys over it and the shared cluster in place of its own, and every bad
//! input refused naming the job and the value.

use std::path::Path;

use strata_models::scenario::jobs::{JobsError, from_toml, is_jobs_file};

const CLUSTER: &str = "[cluster]\npreset = \"dgx-h100\"\nnodes = 16\nfabric = \"fat-tree\"\n";

fn job(name: &str, nodes: &str) -> String {
    format!(
        "[[job]]\nname = \"{name}\"\nnodes = {nodes}\n[job.model]\npreset = \"llama3-8b\"\n\
         [job.parallel]\ntp = 8\nmicro_batch = 1\nglobal_batch = 64\n"
    )
}

fn load(text: &str, overrides: &[&str]) -> Result<strata_models::scenario::jobs::JobsFile, JobsError> {
    let overrides: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios");
    from_toml(text, "jobs.toml", &dir, "jobs", &overrides)
}

#[test]
fn placements_in_three_spellings() {
    let text = format!(
        "{CLUSTER}{}{}{}",
        job("a", "\"0-1,4-5\""),
        job("b", "[3, 2]"),
        job("c", "{ first = 7, count = 4, stride = 2 }")
    );
    let f = load(&text, &[]).unwrap();
    assert!(is_jobs_file(&text));
    assert_eq!(f.name, "jobs");
    assert_eq!(f.cluster.nodes, 16);
    let nodes: Vec<&[u32]> = f.jobs.iter().map(|j| j.nodes.as_slice()).collect();
    assert_eq!(nodes, [&[0, 1, 4, 5][..], &[3, 2], &[7, 9, 11, 13]]);
    // Each job's cluster: the shared one, restricted to its nodes; dp derived from it.
    let a = &f.jobs[0].scenario;
    assert_eq!((a.cluster.nodes, a.cluster.gpus_per_node, a.parallel.dp), (4, 8, 4));
    assert_eq!(f.jobs[1].scenario.parallel.dp, 2);
    assert_eq!(a.name, "a");
    assert!(f.jobs.iter().all(|j| j.note.is_none()));
}

#[test]
fn a_job_from_a_scenario_file_with_its_own_keys_over_it() {
    // llama3-8b-8xa100-40gb.toml: tp 2 · pp 2 · dp 2 on one A100 40 GB node; here it runs on
    // two nodes of the shared dgx-a100 cluster with dp 4.
    let text = "[cluster]\npreset = \"dgx-a100\"\nnodes = 4\n\
                [[job]]\nname = \"l\"\nscenario = \"llama3-8b-8xa100-40gb.toml\"\nnodes = \"2-3\"\n\
                [job.parallel]\ndp = 4\n";
    let f = load(text, &[]).unwrap();
    let j = &f.jobs[0];
    assert_eq!(j.scenario.model.name, "llama3-8b");
    assert_eq!((j.scenario.parallel.tp, j.scenario.parallel.pp, j.scenario.parallel.dp), (2, 2, 4));
    assert_eq!(j.scenario.cluster.gpu, f.cluster.gpu, "the shared cluster's GPU replaces the file's");
    assert_eq!(j.scenario.parallel.global_batch, 32, "the file's other keys stay");
    assert!(j.note.as_deref().is_some_and(|n| n.contains("[cluster] is replaced")), "{:?}", j.note);
}

#[test]
fn overrides_reach_the_cluster_and_each_job() {
    let text = format!("{CLUSTER}{}{}", job("a", "\"0-3\""), job("b", "\"4-7\""));
    let f = load(&text, &["cluster.oversubscription=2.0", "job.b.nodes=\"8-9\"", "job.a.parallel.tp=4"]).unwrap();
    assert_eq!(f.cluster.oversubscription, 2.0);
    assert_eq!(f.jobs[0].scenario.cluster.oversubscription, 2.0);
    assert_eq!(f.jobs[1].nodes, [8, 9]);
    assert_eq!((f.jobs[0].scenario.parallel.tp, f.jobs[0].scenario.parallel.dp), (4, 8));
}

fn refused(text: &str, overrides: &[&str], words: &[&str]) {
    let e = load(text, overrides).map(|_| ()).unwrap_err().to_string();
    for w in words {
        assert!(e.contains(w), "message lacks {w:?}: {e}");
    }
}

#[test]
fn bad_input_names_the_job_and_the_value() {
    let two = |a: &str, b: &str| format!("{CLUSTER}{}{}", job("a", a), job("b", b));
    refused(&two("\"0-3\"", "\"3-6\""), &[], &["job b", "node 3", "job a", "overlap"]);
    refused(&two("\"0-3\"", "\"14-17\""), &[], &["job b", "node 17", "0-15"]);
    refused(&two("\"0-3\"", "\"5-4\""), &[], &["job b", "5-4", "backwards"]);
    refused(&two("\"0-3\"", "[4, 4]"), &[], &["job b", "node 4", "twice"]);
    refused(&two("\"0-3\"", "{ first = 4, count = 0 }"), &[], &["job b", "count = 0"]);
    refused(&two("\"0-3\"", "\"x\""), &[], &["job b", "\"x\""]);
    refused(&two("\"0-3\"", "\"4-7\""), &["job.c.nodes=\"1\""], &["unknown job \"c\"", "a, b"]);
    refused(&two("\"0-3\"", "\"4-7\""), &["job.b.parallel.tp=16"], &["job b", "4 nodes"]);
    refused(&format!("{CLUSTER}{}{}", job("a", "\"0\""), job("a", "\"1\"")), &[], &["job a", "used twice"]);
    refused(&format!("{CLUSTER}[[job]]\nname = \"a b\"\nnodes = \"0\"\n"), &[], &["\"a b\"", "letters, digits"]);
    refused(&format!("{CLUSTER}[[job]]\nname = \"a\"\n"), &[], &["job a", "nodes is missing"]);
    refused(&job("a", "\"0\""), &[], &["[cluster]"]);
    refused(&format!("{CLUSTER}{}[job.faults]\n", job("a", "\"0\"")), &[], &["job a", "unknown key \"faults\""]);
    assert!(!is_jobs_file(CLUSTER));
}
