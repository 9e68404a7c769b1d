//! `strata probe` end to end: on a machine without a GPU it says so and exits 2, and the
//! file it writes describes the CPU host and loads back as a cluster; a launcher's
//! environment sets the nodes, and one a cluster file cannot hold exits 2 naming it.

use std::path::PathBuf;
use std::process::{Command, Output};

const LAUNCHER_VARS: &[&str] = &[
    "SLURM_NNODES",
    "SLURM_JOB_NUM_NODES",
    "SLURM_NTASKS_PER_NODE",
    "SLURM_TASKS_PER_NODE",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
];

fn probe(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_strata"));
    c.arg("probe").args(args);
    for v in LAUNCHER_VARS {
        c.env_remove(v);
    }
    c.envs(env.iter().copied()).output().expect("run strata")
}

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("strata-probe-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::remove_file(&p).ok();
    p
}

fn text(o: &[u8]) -> String {
    String::from_utf8_lossy(o).into_owned()
}

#[test]
fn probe_writes_a_cluster_that_loads_back() {
    let path = tmp("this.toml");
    let out = probe(&["--out", path.to_str().unwrap()], &[]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(!stderr.contains("panicked"), "{stderr}");
    let c = strata_models::scenario::load_cluster(&path).unwrap_or_else(|e| panic!("{e}\n{stdout}\n{stderr}"));
    assert_eq!(c.nodes, 1, "{stdout}");
    assert!(stdout.contains("1 node: no Slurm, Open MPI or torchrun environment is set"), "{stdout}");
    assert!(stdout.contains("built without ibverbs") || stdout.contains("no RDMA device") || c.nics_per_node > 0);
    if out.status.code() == Some(0) {
        // A GPU machine: the file names the catalog's GPU.
        assert_ne!(c.gpu, strata_models::GpuKind::Cpu, "{stdout}");
        return;
    }
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("built without CUDA") || stderr.contains("no GPU found"), "{stderr}");
    assert!(stderr.contains("describes the CPU host"), "{stderr}");
    assert_eq!((c.gpu, c.nics_per_node), (strata_models::GpuKind::Cpu, 0), "{stdout}");
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
    assert_eq!(c.gpus_per_node, threads.min(576));
    // The file is a cluster the simulator takes (a collective needs two ranks).
    if c.gpus_per_node >= 2 {
        let bench = Command::new(env!("CARGO_BIN_EXE_strata"))
            .args(["collbench", "--cluster", path.to_str().unwrap(), "--ranks", "2"])
            .output()
            .unwrap();
        assert!(bench.status.success(), "{}", text(&bench.stderr));
    }
}

#[test]
fn json_and_the_launcher_environment() {
    let out = probe(&["--json"], &[("OMPI_COMM_WORLD_SIZE", "3"), ("OMPI_COMM_WORLD_LOCAL_SIZE", "3")]);
    let v: serde_json::Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out.stdout)));
    assert_eq!(v["machine"]["launch"]["Ok"]["nodes"], 1);
    assert_eq!(v["machine"]["launch"]["Ok"]["source"], "OMPI_COMM_WORLD_SIZE=3 / OMPI_COMM_WORLD_LOCAL_SIZE=3");
    assert_eq!(v["cluster"]["nodes"], 1);
    if v["machine"]["gpus"]["Err"].is_string() {
        // No GPU: the launcher's ranks per node are the CPU ranks.
        assert_eq!(v["cluster"]["gpus_per_node"], 3);
        assert_eq!(v["cluster"]["gpu"], "cpu");
        assert_eq!(out.status.code(), Some(2));
    }
}

#[test]
fn what_a_cluster_file_cannot_hold_exits_2_and_writes_nothing() {
    let path = tmp("bad.toml");
    let out = probe(&["--out", path.to_str().unwrap()], &[("SLURM_NNODES", "many")]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("SLURM_NNODES=\"many\"") && stderr.contains("whole number"), "{stderr}");
    assert!(!path.exists());
    // Two nodes and no RDMA NIC on this machine (CI): nics_per_node = 0 cannot connect them.
    let out = probe(&["--out", path.to_str().unwrap()], &[("SLURM_NNODES", "2")]);
    let stderr = text(&out.stderr);
    if out.status.code() == Some(2) && stderr.contains("nics_per_node") {
        assert!(stderr.contains("2 node(s) from SLURM_NNODES=2") && !stderr.contains("panicked"), "{stderr}");
        assert!(!path.exists());
    }
}
