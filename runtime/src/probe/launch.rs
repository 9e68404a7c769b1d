//! Nodes and ranks per node from the launcher's environment, for `strata probe`: Slurm
//! (`SLURM_NNODES` / `SLURM_JOB_NUM_NODES`, `SLURM_NTASKS_PER_NODE` or the first entry of
//! `SLURM_TASKS_PER_NODE`, whose `8(x4)` form repeats a count), Open MPI's `mpirun`
//! (`OMPI_COMM_WORLD_SIZE` / `OMPI_COMM_WORLD_LOCAL_SIZE`), and torchrun (`WORLD_SIZE` /
//! `LOCAL_WORLD_SIZE`). The first launcher whose node count is set wins. A node count that
//! is not a whole number, or nodes with different rank counts (a cluster is identical
//! nodes), is an error naming the variable.

use serde::Serialize;

/// What the launcher says about the job's shape.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Launch {
    pub nodes: u32,
    /// Ranks (tasks, processes) per node, when the launcher says.
    pub ranks_per_node: Option<u32>,
    /// Where the figures came from: `SLURM_NNODES=4, SLURM_NTASKS_PER_NODE=8`.
    pub source: String,
}

/// The job's shape from the environment `var` reads (`std::env::var` in use; a map in
/// tests); `Ok(None)` outside any launcher.
pub fn from_env(var: &dyn Fn(&str) -> Option<String>) -> Result<Option<Launch>, String> {
    let get = |name: &str| var(name).map(|v| v.trim().to_string()).filter(|v| !v.is_empty());
    let count = |name: &str, v: &str| -> Result<u32, String> {
        match v.parse::<u32>() {
            Ok(n) if n >= 1 => Ok(n),
            _ => Err(format!("{name}={v:?}: expected a whole number of at least 1")),
        }
    };
    // Slurm.
    for nodes_var in ["SLURM_NNODES", "SLURM_JOB_NUM_NODES"] {
        let Some(nodes) = get(nodes_var) else { continue };
        let nodes = count(nodes_var, &nodes)?;
        let mut source = format!("{nodes_var}={nodes}");
        let per_node = if let Some(v) = get("SLURM_NTASKS_PER_NODE") {
            source += &format!(", SLURM_NTASKS_PER_NODE={v}");
            Some(count("SLURM_NTASKS_PER_NODE", &v)?)
        } else if let Some(v) = get("SLURM_TASKS_PER_NODE") {
            source += &format!(", SLURM_TASKS_PER_NODE={v}");
            Some(uniform_tasks(&v)?)
        } else {
            None
        };
        return Ok(Some(Launch { nodes, ranks_per_node: per_node, source }));
    }
    // Open MPI, then torchrun: world and local sizes.
    for (world_var, local_var) in
        [("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"), ("WORLD_SIZE", "LOCAL_WORLD_SIZE")]
    {
        let (Some(world), Some(local)) = (get(world_var), get(local_var)) else { continue };
        let (world, local) = (count(world_var, &world)?, count(local_var, &local)?);
        if !world.is_multiple_of(local) {
            return Err(format!(
                "{world_var}={world} is not a multiple of {local_var}={local}: the nodes run different numbers of \
                 ranks, and a cluster is identical nodes"
            ));
        }
        return Ok(Some(Launch {
            nodes: world / local,
            ranks_per_node: Some(local),
            source: format!("{world_var}={world} / {local_var}={local}"),
        }));
    }
    Ok(None)
}

/// `SLURM_TASKS_PER_NODE`: `8`, `8(x4)`, or `8(x3),4` — the count when every node has the
/// same, else an error.
fn uniform_tasks(v: &str) -> Result<u32, String> {
    let mut counts = Vec::new();
    for part in v.split(',') {
        let n = part.split('(').next().unwrap_or(part);
        counts.push(n.parse::<u32>().ok().filter(|n| *n >= 1).ok_or_else(|| {
            format!("SLURM_TASKS_PER_NODE={v:?}: expected counts such as 8 or 8(x4), separated by commas")
        })?);
    }
    counts.dedup();
    match counts[..] {
        [n] => Ok(n),
        _ => Err(format!(
            "SLURM_TASKS_PER_NODE={v:?}: the nodes run different numbers of tasks, and a cluster is identical nodes"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let pairs: Vec<(String, String)> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |k| pairs.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())
    }

    #[test]
    fn slurm_then_mpi_then_torchrun() {
        assert_eq!(from_env(&env(&[])).unwrap(), None);
        let l = from_env(&env(&[("SLURM_NNODES", "4"), ("SLURM_NTASKS_PER_NODE", "8"), ("OMPI_COMM_WORLD_SIZE", "2")]))
            .unwrap()
            .unwrap();
        assert_eq!((l.nodes, l.ranks_per_node), (4, Some(8)));
        assert_eq!(l.source, "SLURM_NNODES=4, SLURM_NTASKS_PER_NODE=8");
        let l = from_env(&env(&[("SLURM_JOB_NUM_NODES", "16"), ("SLURM_TASKS_PER_NODE", "8(x16)")])).unwrap().unwrap();
        assert_eq!((l.nodes, l.ranks_per_node), (16, Some(8)));
        let l = from_env(&env(&[("SLURM_NNODES", "2")])).unwrap().unwrap();
        assert_eq!((l.nodes, l.ranks_per_node), (2, None));
        let l =
            from_env(&env(&[("OMPI_COMM_WORLD_SIZE", "32"), ("OMPI_COMM_WORLD_LOCAL_SIZE", "8")])).unwrap().unwrap();
        assert_eq!((l.nodes, l.ranks_per_node), (4, Some(8)));
        let l = from_env(&env(&[("WORLD_SIZE", "16"), ("LOCAL_WORLD_SIZE", "8")])).unwrap().unwrap();
        assert_eq!((l.nodes, l.ranks_per_node), (2, Some(8)));
        // A world size without a local size says nothing about nodes.
        assert_eq!(from_env(&env(&[("WORLD_SIZE", "16")])).unwrap(), None);
    }

    #[test]
    fn bad_values_name_the_variable() {
        let e = from_env(&env(&[("SLURM_NNODES", "four")])).unwrap_err();
        assert!(e.contains("SLURM_NNODES=\"four\"") && e.contains("whole number"), "{e}");
        let e = from_env(&env(&[("SLURM_NNODES", "0")])).unwrap_err();
        assert!(e.contains("at least 1"), "{e}");
        let e = from_env(&env(&[("SLURM_NNODES", "3"), ("SLURM_TASKS_PER_NODE", "8(x2),4")])).unwrap_err();
        assert!(e.contains("SLURM_TASKS_PER_NODE") && e.contains("identical nodes"), "{e}");
        let e = from_env(&env(&[("SLURM_NNODES", "3"), ("SLURM_TASKS_PER_NODE", "x")])).unwrap_err();
        assert!(e.contains("8(x4)"), "{e}");
        let e = from_env(&env(&[("OMPI_COMM_WORLD_SIZE", "12"), ("OMPI_COMM_WORLD_LOCAL_SIZE", "8")])).unwrap_err();
        assert!(e.contains("not a multiple"), "{e}");
    }

    #[test]
    fn a_repeated_count_is_uniform() {
        assert_eq!(uniform_tasks("8(x3),8").unwrap(), 8);
        assert_eq!(uniform_tasks("4").unwrap(), 4);
    }
}
