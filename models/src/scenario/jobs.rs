//! Multi-job files: several training jobs placed on the nodes of one shared cluster.
//!
//! ```toml
//! name = "two-jobs"
//! [cluster]                      # the shared cluster, as a scenario's [cluster]
//! preset = "dgx-h100"
//! nodes = 16
//! fabric = "fat-tree"
//! oversubscription = 4.0
//! [[job]]
//! name = "a"
//! scenario = "llama3-8b.toml"    # relative to this file; or inline tables below
//! nodes = "0-7"                  # "0-3,8-11", [0, 2, 4], or { first = 0, count = 8, stride = 2 }
//! [job.parallel]                 # optional: keys over the scenario file's (or the whole job)
//! dp = 8
//! [[job]]
//! name = "b"
//! ...
//! ```
//!
//! A job is a scenario — its `scenario` file, with the job's own `model`, `parallel`,
//! `training` tables laid over it key by key — whose cluster is the shared one restricted to
//! the job's nodes: the shared `[cluster]` table with `nodes` = the job's node count (a
//! job's scenario's own `[cluster]` is replaced, and [`Job::note`] says so). So a job's split
//! must fill its nodes (tp · pp · dp = its nodes × GPUs per node), as scenario validation
//! checks. Placements are node lists, in the order the job's ranks fill them; no node may
//! hold two jobs and every node must exist. `--set` reaches the shared cluster as
//! `cluster.KEY=VALUE`, the file's `name`, and a job as `job.NAME.KEY=VALUE`
//! (`job.a.nodes="8-15"`, `job.a.parallel.tp=4`). Limits: [`MAX_JOBS`] jobs, names of
//! at most [`MAX_JOB_NAME`] characters from `[A-Za-z0-9_-]`.

use std::path::{Path, PathBuf};

use super::input::{apply_override, short};
use super::{RawCluster, Scenario, ScenarioError, resolve_cluster};
use crate::cluster::ClusterSpec;
pub use crate::limits::{MAX_JOB_NAME, MAX_JOBS};

/// One job of a multi-job file.
#[derive(Clone, Debug, PartialEq)]
pub struct Job {
    pub name: String,
    /// The shared cluster's node indices, in the order the job's ranks fill them.
    pub nodes: Vec<u32>,
    /// The job's scenario, its cluster the shared one with `nodes.len()` nodes.
    pub scenario: Scenario,
    /// What the loader changed in the job's scenario (its own `[cluster]` replaced).
    pub note: Option<String>,
}

/// A multi-job file, resolved and validated.
#[derive(Clone, Debug, PartialEq)]
pub struct JobsFile {
    pub name: String,
    pub cluster: ClusterSpec,
    pub jobs: Vec<Job>,
}

/// What can go wrong reading a multi-job file. Every message names the value and what to do.
#[derive(Debug, thiserror::Error)]
pub enum JobsError {
    #[error("cannot read {path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("multi-job file {origin} is not valid: {message}")]
    Parse { origin: String, message: String },
    #[error("{origin}: job {job}: {message}")]
    Job { origin: String, job: String, message: String },
    #[error("{origin}: job {job}, placed on {nodes} nodes (its cluster): {source}")]
    Scenario { origin: String, job: String, nodes: usize, source: Box<ScenarioError> },
    #[error("{0}")]
    Cluster(Box<ScenarioError>),
    #[error("bad override --set {spec}: unknown job \"{name}\"; the jobs are {known}")]
    UnknownJob { spec: String, name: String, known: String },
    #[error(transparent)]
    Override(Box<ScenarioError>),
}

/// Whether TOML text is a multi-job file (it has `[[job]]` tables) rather than a scenario.
pub fn is_jobs_file(text: &str) -> bool {
    toml::from_str::<toml::Table>(text).is_ok_and(|t| t.contains_key("job"))
}

/// Reads, overrides, resolves and validates a multi-job file; job scenario paths are
/// relative to its directory.
pub fn load(path: &Path, overrides: &[String]) -> Result<JobsFile, JobsError> {
    let origin = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| JobsError::Io { path: origin.clone(), source })?;
    let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
    let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    from_toml(&text, &origin, &dir, &stem, overrides)
}

const JOB_KEYS: &[&str] = &["name", "description", "scenario", "nodes", "model", "parallel", "training"];
const TOP_KEYS: &[&str] = &["name", "description", "cluster", "job"];

/// Parses multi-job text; `dir` is where job scenario paths start.
pub fn from_toml(
    text: &str,
    origin: &str,
    dir: &Path,
    default_name: &str,
    overrides: &[String],
) -> Result<JobsFile, JobsError> {
    let parse = |message: String| JobsError::Parse { origin: origin.to_string(), message: short(&message) };
    let mut doc: toml::Table = toml::from_str(text).map_err(|e| parse(e.to_string()))?;
    if let Some(k) = doc.keys().find(|k| !TOP_KEYS.contains(&k.as_str())) {
        return Err(parse(format!("unknown key \"{k}\"; a multi-job file has {}", TOP_KEYS.join(", "))));
    }
    let mut jobs: Vec<toml::Table> = match doc.remove("job") {
        Some(toml::Value::Array(a)) => a
            .into_iter()
            .map(|v| match v {
                toml::Value::Table(t) => Ok(t),
                _ => Err(parse("job must be an array of tables, written [[job]]".into())),
            })
            .collect::<Result<_, _>>()?,
        _ => return Err(parse("job must be an array of tables, written [[job]]".into())),
    };
    if jobs.is_empty() || jobs.len() > MAX_JOBS {
        return Err(parse(format!("it has {} jobs; a multi-job file has 1 to {MAX_JOBS} [[job]] tables", jobs.len())));
    }
    let names = jobs.iter().enumerate().map(|(i, j)| job_name(j, i, origin)).collect::<Result<Vec<_>, _>>()?;
    for (i, n) in names.iter().enumerate() {
        if names[..i].contains(n) {
            return Err(JobsError::Job {
                origin: origin.into(),
                job: n.clone(),
                message: "the name is used twice; give every job its own name".into(),
            });
        }
    }
    for spec in overrides {
        apply(&mut doc, &mut jobs, &names, spec)?;
    }
    let name = match doc.get("name") {
        Some(toml::Value::String(s)) => s.clone(),
        Some(_) => return Err(parse("name must be a string".into())),
        None => default_name.to_string(),
    };
    let cluster_table = match doc.remove("cluster") {
        Some(toml::Value::Table(t)) => t,
        _ => return Err(parse("the shared cluster is missing: add a [cluster] table, as in a scenario".into())),
    };
    let cluster = shared_cluster(&cluster_table, origin)?;
    let mut out = Vec::with_capacity(jobs.len());
    for (table, name) in jobs.into_iter().zip(names) {
        out.push(job(table, name, &cluster_table, &cluster, origin, dir)?);
    }
    check_overlaps(&out, cluster.nodes, origin)?;
    Ok(JobsFile { name, cluster, jobs: out })
}

/// No node holds two jobs.
fn check_overlaps(jobs: &[Job], cluster_nodes: u32, origin: &str) -> Result<(), JobsError> {
    let mut owner: Vec<Option<usize>> = vec![None; cluster_nodes as usize];
    for (j, job) in jobs.iter().enumerate() {
        for &n in &job.nodes {
            match owner.get_mut(n as usize) {
                Some(Some(other)) => {
                    return Err(JobsError::Job {
                        origin: origin.into(),
                        job: job.name.clone(),
                        message: format!(
                            "node {n} is also placed to job {}: placements overlap; give each job its own nodes",
                            jobs[*other].name
                        ),
                    });
                }
                Some(slot) => *slot = Some(j),
                None => {} // out-of-range nodes were refused by the placement
            }
        }
    }
    Ok(())
}

fn job_name(t: &toml::Table, index: usize, origin: &str) -> Result<String, JobsError> {
    let bad = |message: String| JobsError::Parse { origin: origin.to_string(), message };
    let Some(v) = t.get("name") else {
        return Err(bad(format!("job #{} has no name; give it one, e.g. name = \"a\"", index + 1)));
    };
    let Some(n) = v.as_str() else { return Err(bad(format!("job #{}: name must be a string", index + 1))) };
    let ok = !n.is_empty()
        && n.len() <= MAX_JOB_NAME
        && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if !ok {
        return Err(bad(format!(
            "job #{}: name = \"{}\": a job name is 1 to {MAX_JOB_NAME} characters of letters, digits, - and _",
            index + 1,
            short(n)
        )));
    }
    Ok(n.to_string())
}

/// Applies one `--set`: `job.NAME.KEY=V` to a job, anything else to the file.
fn apply(doc: &mut toml::Table, jobs: &mut [toml::Table], names: &[String], spec: &str) -> Result<(), JobsError> {
    let Some(rest) = spec.trim_start().strip_prefix("job.") else {
        return apply_override(doc, spec).map_err(|e| JobsError::Override(Box::new(e)));
    };
    let (name, key) = rest.split_once('.').unwrap_or((rest, ""));
    let Some(i) = names.iter().position(|n| n == name) else {
        return Err(JobsError::UnknownJob { spec: short(spec), name: short(name), known: names.join(", ") });
    };
    apply_override(&mut jobs[i], key).map_err(|e| JobsError::Override(Box::new(e)))
}

fn shared_cluster(table: &toml::Table, origin: &str) -> Result<ClusterSpec, JobsError> {
    use serde::Deserialize;
    let origin = format!("{origin} [cluster]");
    let raw = RawCluster::deserialize(toml::Value::Table(table.clone())).map_err(|e| {
        JobsError::Cluster(Box::new(ScenarioError::Parse { origin: origin.clone(), message: short(&e.to_string()) }))
    })?;
    let cluster = resolve_cluster(raw, &origin).map_err(|e| JobsError::Cluster(Box::new(e)))?;
    cluster
        .check()
        .map_err(|message| JobsError::Cluster(Box::new(ScenarioError::Invalid { origin, message, config: None })))?;
    Ok(cluster)
}

fn job(
    mut t: toml::Table,
    name: String,
    cluster_table: &toml::Table,
    cluster: &ClusterSpec,
    origin: &str,
    dir: &Path,
) -> Result<Job, JobsError> {
    let bad = |message: String| JobsError::Job { origin: origin.into(), job: name.clone(), message };
    if let Some(k) = t.keys().find(|k| !JOB_KEYS.contains(&k.as_str())) {
        return Err(bad(format!("unknown key \"{}\"; a [[job]] has {}", short(k), JOB_KEYS.join(", "))));
    }
    let nodes = match t.remove("nodes") {
        Some(v) => super::placement::nodes(&v, cluster.nodes).map_err(bad)?,
        None => return Err(bad("nodes is missing: place the job, e.g. nodes = \"0-7\"".into())),
    };
    let mut doc = match t.remove("scenario") {
        Some(toml::Value::String(p)) => {
            let path: PathBuf = dir.join(&p);
            let text = std::fs::read_to_string(&path)
                .map_err(|e| bad(format!("cannot read its scenario {}: {e}", path.display())))?;
            toml::from_str::<toml::Table>(&text).map_err(|e| {
                bad(format!("its scenario {} is not valid TOML: {}", path.display(), short(&e.to_string())))
            })?
        }
        Some(_) => return Err(bad("scenario must be a path (a string), relative to this file".into())),
        None => toml::Table::new(),
    };
    for key in ["model", "parallel", "training"] {
        match t.remove(key) {
            Some(toml::Value::Table(over)) => {
                let entry = doc.entry(key).or_insert_with(|| toml::Value::Table(toml::Table::new()));
                let Some(base) = entry.as_table_mut() else {
                    return Err(bad(format!("its scenario's {key} is not a table")));
                };
                base.extend(over);
            }
            Some(_) => return Err(bad(format!("{key} must be a table, [job.{key}]"))),
            None => {}
        }
    }
    if doc.get("faults").is_some() {
        return Err(bad(
            "its scenario has a [faults] table; what-ifs are per scenario and a multi-job run does not apply them: remove it"
                .into(),
        ));
    }
    let note = doc.get("cluster").map(|_| {
        format!("its scenario's [cluster] is replaced by the shared cluster's {} nodes it is placed on", nodes.len())
    });
    let mut shared = cluster_table.clone();
    shared.insert("nodes".into(), toml::Value::Integer(nodes.len() as i64));
    doc.insert("cluster".into(), toml::Value::Table(shared));
    doc.insert("name".into(), toml::Value::String(name.clone()));
    let text = toml::to_string(&doc).map_err(|e| bad(format!("cannot assemble its scenario: {e}")))?;
    let scenario = Scenario::from_toml(&text, &format!("of job {name}"), &name, &[]).map_err(|source| {
        JobsError::Scenario { origin: origin.into(), job: name.clone(), nodes: nodes.len(), source: Box::new(source) }
    })?;
    Ok(Job { name, nodes, scenario, note })
}
