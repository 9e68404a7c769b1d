//! Probe's cluster from synthetic findings: a DGX H200 node under Slurm, the CPU host, and
//! the findings a cluster file cannot hold; every written file read back by models'
//! `load_cluster`.

use super::rdma::{LinkLayer, RdmaPort, port_gbps};
use super::*;

fn h200(i: usize) -> Gpu {
    let others: Vec<usize> = (0..8).filter(|j| *j != i).collect();
    Gpu {
        ordinal: i,
        name: "NVIDIA H200".into(),
        kind: catalog_kind("NVIDIA H200"),
        memory_bytes: 150_754_820_096,
        sms: 132,
        compute_capability: (9, 0),
        peers: others.clone(),
        nvlink_peers: others,
        peer_error: None,
    }
}

fn port(device: &str, state: u32, layer: u8, speed: u8, width: u8) -> RdmaPort {
    RdmaPort {
        device: device.into(),
        port: 1,
        state,
        link_layer: LinkLayer::from_code(layer),
        active_speed: speed,
        active_speed_ex: 0,
        active_width: width,
        gbps: port_gbps(speed, 0, width),
    }
}

fn read_back(found: &Found) -> ClusterSpec {
    let path =
        std::env::temp_dir().join(format!("strata-probe-test-{}-{}.toml", std::process::id(), found.cluster.name));
    std::fs::write(&path, found.toml()).unwrap();
    let c = strata_models::scenario::load_cluster(&path);
    std::fs::remove_file(&path).ok();
    c.unwrap_or_else(|e| panic!("{e}\n{}", found.toml()))
}

#[test]
fn driver_names_map_to_the_catalog() {
    assert_eq!(catalog_kind("NVIDIA H200"), Some(GpuKind::H200Sxm));
    assert_eq!(catalog_kind("NVIDIA H100 80GB HBM3"), Some(GpuKind::H100Sxm));
    assert_eq!(catalog_kind("NVIDIA A100-SXM4-80GB"), Some(GpuKind::A100_80gb));
    assert_eq!(catalog_kind("NVIDIA A100-SXM4-40GB"), Some(GpuKind::A100_40gb));
    assert_eq!(catalog_kind("NVIDIA B200"), Some(GpuKind::B200));
    for other in
        ["NVIDIA H100 PCIe", "NVIDIA H100 NVL", "NVIDIA H200 NVL", "NVIDIA GH200 480GB", "NVIDIA A100 80GB PCIe"]
    {
        assert_eq!(catalog_kind(other), None, "{other}");
    }
}

#[test]
fn a_dgx_h200_node_under_slurm_is_a_rail_optimised_cluster() {
    let mut ports: Vec<RdmaPort> = (0..8).map(|i| port(&format!("mlx5_{i}"), 4, 1, 128, 2)).collect();
    // Two storage ports (RoCE 200 GbE) and one compute port down: not counted.
    ports.push(port("mlx5_8", 4, 2, 64, 2));
    ports.push(port("mlx5_9", 4, 2, 64, 2));
    ports.push(port("mlx5_10", 1, 1, 128, 2));
    let m = Machine {
        hostname: "node001".into(),
        cpus: 224,
        gpus: Ok((0..8).map(h200).collect()),
        rdma: Ok(ports),
        launch: launch::from_env(&|k| match k {
            "SLURM_NNODES" => Some("4".into()),
            "SLURM_NTASKS_PER_NODE" => Some("8".into()),
            _ => None,
        }),
    };
    let f = m.cluster().unwrap();
    let c = read_back(&f);
    assert_eq!(c, f.cluster);
    assert_eq!((c.gpu, c.nodes, c.gpus_per_node, c.nics_per_node, c.nic_gbps), (GpuKind::H200Sxm, 4, 8, 8, 400.0));
    assert_eq!(c.fabric, Fabric::RailOptimized);
    assert_eq!(c.nic_efficiency, 1.0);
    let text = f.toml();
    assert!(
        text.contains(
            "# - 8 × NVIDIA H200 (h200-sxm): 143771 MiB, 132 SMs, compute capability 9.0 (catalog: 143771 MiB, 132 SMs)"
        ),
        "{text}"
    );
    assert!(text.contains("NIC: mlx5_0 port 1: ACTIVE, InfiniBand, 4x NDR = 400 Gb/s"), "{text}");
    assert!(text.contains("not counted as a compute NIC: mlx5_8 port 1: ACTIVE, RoCE"), "{text}");
    assert!(text.contains("not counted as a compute NIC: mlx5_10 port 1: DOWN"), "{text}");
    assert!(text.contains("4 node(s) from SLURM_NNODES=4, SLURM_NTASKS_PER_NODE=8"), "{text}");
    assert!(text.contains("not visible from one node: the fabric"), "{text}");
    assert!(text.contains("every GPU pair is an NVLink peer (NVLink = peer access with native atomics"), "{text}");
    assert!(!text.contains("not every GPU pair"), "{text}");
}

#[test]
fn aws_efa_ports_get_the_share_of_line_rate_nccl_reaches() {
    // Four EFA devices at 4x EDR (100 Gb/s each), as on a p4d node.
    let m = Machine {
        hostname: "p4d".into(),
        cpus: 96,
        gpus: Ok((0..8).map(h200).collect()),
        rdma: Ok((0..4).map(|i| port(&format!("efa_{i}"), 4, 1, 32, 2)).collect()),
        launch: Ok(None),
    };
    let f = m.cluster().unwrap();
    let c = read_back(&f);
    assert_eq!(c, f.cluster);
    assert_eq!((c.nics_per_node, c.nic_gbps, c.nic_efficiency), (4, 100.0, EFA_2022_NIC_EFFICIENCY));
    assert!(f.notes.iter().any(|n| n.contains("the NICs are AWS EFA: nic_efficiency = 0.62")), "{:?}", f.notes);
    // Mellanox ports alongside are not EFA.
    let mut ports: Vec<RdmaPort> = (0..4).map(|i| port(&format!("mlx5_{i}"), 4, 1, 32, 2)).collect();
    ports[0].device = "efa_0".into();
    let f = Machine { rdma: Ok(ports), ..m }.cluster().unwrap();
    assert_eq!(f.cluster.nic_efficiency, 1.0);
}

#[test]
fn gpus_without_nvlink_between_all_pairs_are_noted() {
    let mut gpus: Vec<Gpu> = (0..2).map(h200).collect();
    for g in &mut gpus {
        g.peers = vec![1 - g.ordinal];
        g.nvlink_peers.clear();
    }
    let m = Machine {
        hostname: "pcie".into(),
        cpus: 8,
        gpus: Ok(gpus),
        rdma: Err("no RDMA device".into()),
        launch: Ok(None),
    };
    let f = m.cluster().unwrap();
    assert_eq!(read_back(&f), f.cluster);
    assert_eq!((f.cluster.gpus_per_node, f.cluster.nics_per_node, f.cluster.fabric), (2, 0, Fabric::SingleSwitch));
    assert!(f.notes.iter().any(|n| n.contains("not every GPU pair is an NVLink peer")), "{:?}", f.notes);
    assert!(f.notes.iter().any(|n| n.contains("no RDMA device; the file has no NICs")), "{:?}", f.notes);
    // Peers that could not be read are said so, not taken for missing NVLink.
    let mut gpus: Vec<Gpu> = (0..2).map(h200).collect();
    for g in &mut gpus {
        (g.peers, g.nvlink_peers, g.peer_error) = (vec![], vec![], Some("reading P2P attributes: no".into()));
    }
    let f = Machine { gpus: Ok(gpus), ..m }.cluster().unwrap();
    assert!(
        f.notes.iter().any(|n| n == "the GPUs' peers could not be read: reading P2P attributes: no"),
        "{:?}",
        f.notes
    );
    assert!(!f.notes.iter().any(|n| n.contains("NVLink peer")), "{:?}", f.notes);
}

#[test]
fn without_a_gpu_the_file_describes_the_cpu_host() {
    let m = Machine {
        hostname: "ci \"box\"".into(),
        cpus: 2,
        gpus: Err("built without CUDA: …".into()),
        rdma: Err("built without ibverbs: …".into()),
        launch: Ok(None),
    };
    let f = m.cluster().unwrap();
    let c = read_back(&f);
    assert_eq!((c.gpu, c.nodes, c.gpus_per_node, c.nics_per_node), (GpuKind::Cpu, 1, 2, 0));
    assert_eq!(c.name, "probed-ci \"box\"");
    let text = f.toml();
    assert!(text.contains("built without CUDA: …; the file describes the CPU host"), "{text}");
    assert!(text.contains("host ci \"box\": 2 hardware threads"), "{text}");
    // Under mpirun without GPUs, the ranks per node are the CPU ranks.
    let m = Machine {
        launch: launch::from_env(&|k| match k {
            "OMPI_COMM_WORLD_SIZE" => Some("4".into()),
            "OMPI_COMM_WORLD_LOCAL_SIZE" => Some("4".into()),
            _ => None,
        }),
        ..m
    };
    assert_eq!(m.cluster().unwrap().cluster.gpus_per_node, 4);
}

#[test]
fn findings_a_cluster_cannot_hold_are_errors_naming_them() {
    let base = Machine { hostname: "h".into(), cpus: 4, gpus: Ok(vec![h200(0)]), rdma: Ok(vec![]), launch: Ok(None) };
    let mut odd = h200(0);
    odd.name = "NVIDIA H100 PCIe".into();
    odd.kind = None;
    let e = Machine { gpus: Ok(vec![odd.clone()]), ..base.clone() }.cluster().unwrap_err();
    assert!(
        e.contains("\"NVIDIA H100 PCIe\"") && e.contains("not in Strata's GPU catalog") && e.contains("h200-sxm"),
        "{e}"
    );
    odd.ordinal = 1;
    let e = Machine { gpus: Ok(vec![h200(0), odd]), ..base.clone() }.cluster().unwrap_err();
    assert!(e.contains("one model"), "{e}");
    // Several nodes but no NIC: not a cluster Strata loads.
    let two = launch::from_env(&|k| (k == "SLURM_NNODES").then(|| "2".into()));
    let e = Machine { launch: two, ..base.clone() }.cluster().unwrap_err();
    assert!(e.contains("nics_per_node = 0") && e.contains("2 node(s) from SLURM_NNODES=2"), "{e}");
    let bad = launch::from_env(&|k| (k == "SLURM_NNODES").then(|| "x".into()));
    assert!(Machine { launch: bad, ..base }.cluster().unwrap_err().contains("SLURM_NNODES"));
}

#[test]
fn this_machine_probes_without_a_panic_and_writes_a_loadable_file() {
    let m = probe();
    // On a CI machine (no GPU, no RDMA) the reasons are values; wherever this runs, the
    // file it writes loads back (or the reason it cannot is a value).
    if let Ok(f) = m.cluster() {
        assert_eq!(read_back(&f), f.cluster);
    }
    if let Err(e) = m.gpus {
        assert!(e.contains("built without CUDA") || e.contains("no GPU found"), "{e}");
    }
}
