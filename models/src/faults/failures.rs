//! Failure processes of a long run (`[faults.failures]`): what `strata goodput` draws from.
//!
//! Six causes, each a renewal process per component with a mean time between failures
//! (MTBF, hours) and a distribution (exponential, or Weibull with a shape k; k < 1 is infant
//! mortality, k > 1 wear-out); `job` adds one process for the job as a whole (off unless
//! set). A cause counts per GPU (`gpu`, `hbm`, `software`) or per node (`host`, `nic`,
//! `switch`), so a job on N units sees N times the rate. Every failure stops the job: the
//! work since the last durable checkpoint is lost and the job restarts.
//!
//! Defaults (`rates = "llama3"`) are the 419 unexpected interruptions of Llama 3 405B's
//! 54-day snapshot on 16,384 H100 (2,048 nodes), Table 5 of arXiv 2407.21783, grouped by
//! cause; `rates = "none"` keeps only the causes a scenario sets. The table with sources is
//! in `docs/goodput.md`; [`LLAMA3`] holds the counts.
//!
//! A checkpoint writes the model states (weights and optimizer, not gradients) once,
//! deduplicated over data-parallel replicas; `sync` blocks for bytes ÷ `write_gbps`, `async`
//! blocks for the largest per-rank shard ÷ `staging_gbps` (device → host copy) and writes in
//! the background; the checkpoint counts only once the write has finished. A restart costs
//! `detect_s + reschedule_s + init_s` plus the load, bytes ÷ `read_gbps`.

use serde::{Deserialize, Serialize};

use crate::limits::{
    MAX_FAILURE_MTBF_HOURS, MAX_FAILURE_SECONDS, MAX_STORAGE_GBPS, MAX_WEIBULL_SHAPE, MIN_FAILURE_MTBF_HOURS,
    MIN_STORAGE_GBPS, MIN_WEIBULL_SHAPE,
};

/// Hours in the Llama 3 snapshot: 54 days.
pub const LLAMA3_HOURS: f64 = 54.0 * 24.0;
/// GPUs and nodes of the Llama 3 405B run the snapshot covers.
pub const LLAMA3_GPUS: f64 = 16_384.0;
pub const LLAMA3_NODES: f64 = 2_048.0;

/// What a cause counts per: one GPU, one node (8 GPUs there), or the job as a whole.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Unit {
    Gpu,
    Node,
    Job,
}

/// The causes, in report order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Cause {
    Gpu,
    Hbm,
    Host,
    Nic,
    Switch,
    Software,
    Job,
}

impl Cause {
    pub const ALL: [Cause; 7] =
        [Cause::Gpu, Cause::Hbm, Cause::Host, Cause::Nic, Cause::Switch, Cause::Software, Cause::Job];

    /// The key under `[faults.failures]`.
    pub fn key(self) -> &'static str {
        match self {
            Cause::Gpu => "gpu",
            Cause::Hbm => "hbm",
            Cause::Host => "host",
            Cause::Nic => "nic",
            Cause::Switch => "switch",
            Cause::Software => "software",
            Cause::Job => "job",
        }
    }

    pub fn unit(self) -> Unit {
        match self {
            Cause::Gpu | Cause::Hbm | Cause::Software => Unit::Gpu,
            Cause::Host | Cause::Nic | Cause::Switch => Unit::Node,
            Cause::Job => Unit::Job,
        }
    }
}

/// Llama 3 405B, Table 5 (arXiv 2407.21783 §3.3.4): unexpected interruptions in 54 days on
/// 16,384 H100, grouped by cause. gpu = faulty GPU 148 + SRAM 19 + GSP 17 + silent data
/// corruption 6 + thermal interface/sensor 6; hbm = HBM3 72; host = host maintenance 32 +
/// SSD 3 + power supply 3 + chassis 2 + IO expansion board 2 + CPU 2 + system memory 2;
/// nic = 7; switch = network switch/cable 35; software = software bug 54 + NCCL watchdog 7 +
/// dependency 2. Sum 419.
pub const LLAMA3: [(Cause, u32); 6] = [
    (Cause::Gpu, 196),
    (Cause::Hbm, 72),
    (Cause::Host, 46),
    (Cause::Nic, 7),
    (Cause::Switch, 35),
    (Cause::Software, 63),
];

/// Storage bandwidth default, GB/s: Meta's Tectonic under Llama 3, 2 TB/s sustained (7 TB/s
/// peak), Llama 3 §3.3.1.
pub const DEFAULT_STORAGE_GBPS: f64 = 2000.0;
/// Device → host staging of an asynchronous save, GB/s per GPU: PCIe Gen5 x16 as NCCL models
/// it (48 GB/s, nccl topo.cc).
pub const DEFAULT_STAGING_GBPS: f64 = 48.0;
/// Restart parts, seconds. Kokolis et al. (HPCA'25, arXiv 2410.21680) model a restart
/// overhead u0 of 5–20 min and assume 5; we split those 5 minutes (our assumption) into
/// detection (a NCCL/watchdog timeout), rescheduling onto spare nodes, and process-group /
/// NCCL initialisation; the checkpoint load comes on top, from the storage bandwidth.
pub const DEFAULT_DETECT_S: f64 = 120.0;
pub const DEFAULT_RESCHEDULE_S: f64 = 120.0;
pub const DEFAULT_INIT_S: f64 = 60.0;

/// Which published rates fill the causes a scenario leaves unset.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Rates {
    /// Llama 3 405B's Table 5 (the default).
    #[default]
    Llama3,
    /// None: only the causes set in the table fail.
    None,
}

/// The distribution of one component's time between failures.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Distribution {
    #[default]
    Exponential,
    Weibull,
}

/// One cause: `gpu = { mtbf_hours = 100000, distribution = "weibull", shape = 0.8 }`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ComponentSpec {
    /// Mean time between failures of one unit (a GPU, a node, or the job), hours.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtbf_hours: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub distribution: Option<Distribution>,
    /// Weibull shape k (1 = exponential); only with `distribution = "weibull"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shape: Option<f64>,
}

/// Synchronous (training waits for the write) or asynchronous (waits for the staging copy).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SaveMode {
    #[default]
    Sync,
    Async,
}

/// `[faults.failures.checkpoint]`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckpointSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<SaveMode>,
    /// Aggregate storage write bandwidth, GB/s (10^9 bytes per second).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_gbps: Option<f64>,
    /// Aggregate storage read bandwidth, GB/s (the load on restart).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_gbps: Option<f64>,
    /// Per-GPU device → host bandwidth of an asynchronous save's staging copy, GB/s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub staging_gbps: Option<f64>,
    /// A fixed blocking time per save, seconds, instead of one from bytes and bandwidth.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub save_s: Option<f64>,
    /// The run's checkpoint interval, seconds of training (goodput reports it beside the best).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval_s: Option<f64>,
}

/// `[faults.failures.restart]`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RestartSpec {
    /// From the failure to the job knowing it (watchdog / health-check timeout), seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detect_s: Option<f64>,
    /// Replacing the failed nodes and relaunching, seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reschedule_s: Option<f64>,
    /// Process groups and NCCL communicators, seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_s: Option<f64>,
    /// A fixed checkpoint load time, seconds, instead of bytes ÷ `read_gbps`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_s: Option<f64>,
}

/// Failure rates, checkpoint and restart costs. Empty: the published defaults apply.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FailureSpec {
    #[serde(default, skip_serializing_if = "is_default")]
    pub rates: Rates,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<ComponentSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hbm: Option<ComponentSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<ComponentSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nic: Option<ComponentSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub switch: Option<ComponentSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub software: Option<ComponentSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<ComponentSpec>,
    #[serde(default, skip_serializing_if = "is_default")]
    pub checkpoint: CheckpointSpec,
    #[serde(default, skip_serializing_if = "is_default")]
    pub restart: RestartSpec,
}

fn is_default<T: Default + PartialEq>(v: &T) -> bool {
    *v == T::default()
}

/// One resolved cause: units × a per-unit process.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Process {
    pub cause: Cause,
    /// How many units fail independently (GPUs, nodes, or 1 for the job).
    pub units: u64,
    pub mtbf_hours: f64,
    pub distribution: Distribution,
    /// Weibull shape (1 for exponential).
    pub shape: f64,
}

impl FailureSpec {
    /// Nothing set (so a written-back scenario omits the table).
    pub fn is_default(&self) -> bool {
        *self == FailureSpec::default()
    }

    fn component(&self, c: Cause) -> Option<&ComponentSpec> {
        match c {
            Cause::Gpu => self.gpu.as_ref(),
            Cause::Hbm => self.hbm.as_ref(),
            Cause::Host => self.host.as_ref(),
            Cause::Nic => self.nic.as_ref(),
            Cause::Switch => self.switch.as_ref(),
            Cause::Software => self.software.as_ref(),
            Cause::Job => self.job.as_ref(),
        }
    }

    /// The published per-unit MTBF of a cause under `rates`, hours.
    pub fn default_mtbf_hours(rates: Rates, c: Cause) -> Option<f64> {
        if rates == Rates::None {
            return None;
        }
        let count = LLAMA3.iter().find(|(k, _)| *k == c)?.1 as f64;
        let units = match c.unit() {
            Unit::Gpu => LLAMA3_GPUS,
            Unit::Node => LLAMA3_NODES,
            Unit::Job => return None,
        };
        Some(LLAMA3_HOURS * units / count)
    }

    /// The processes that fail a job on `gpus` GPUs in `nodes` nodes, in [`Cause::ALL`] order.
    /// Assumes [`FailureSpec::check`] passed.
    pub fn processes(&self, gpus: u64, nodes: u64) -> Vec<Process> {
        let mut out = Vec::new();
        for c in Cause::ALL {
            let spec = self.component(c);
            let mtbf = spec.and_then(|s| s.mtbf_hours).or_else(|| Self::default_mtbf_hours(self.rates, c));
            let Some(mtbf_hours) = mtbf else { continue };
            let distribution = spec.and_then(|s| s.distribution).unwrap_or_default();
            let shape = match distribution {
                Distribution::Exponential => 1.0,
                Distribution::Weibull => spec.and_then(|s| s.shape).unwrap_or(1.0),
            };
            let units = match c.unit() {
                Unit::Gpu => gpus,
                Unit::Node => nodes,
                Unit::Job => 1,
            };
            out.push(Process { cause: c, units, mtbf_hours, distribution, shape });
        }
        out
    }

    /// Every value within its limits, named by its key (`faults.failures.gpu.mtbf_hours = -1 …`).
    pub fn check(&self) -> Result<(), String> {
        let mut lines = Vec::new();
        let mut real = |key: String, v: Option<f64>, min: f64, max: f64, unit: &str| {
            if let Some(v) = v
                && !(v.is_finite() && v >= min && v <= max)
            {
                lines.push(format!(
                    "faults.failures.{key} = {v}: it must be a finite number in [{min}, {max}]{unit} (see docs/limits.md)"
                ));
            }
        };
        for c in Cause::ALL {
            let Some(s) = self.component(c) else { continue };
            let k = c.key();
            real(format!("{k}.mtbf_hours"), s.mtbf_hours, MIN_FAILURE_MTBF_HOURS, MAX_FAILURE_MTBF_HOURS, " hours");
            real(format!("{k}.shape"), s.shape, MIN_WEIBULL_SHAPE, MAX_WEIBULL_SHAPE, "");
        }
        let cp = &self.checkpoint;
        for (k, v) in [("write_gbps", cp.write_gbps), ("read_gbps", cp.read_gbps), ("staging_gbps", cp.staging_gbps)] {
            real(format!("checkpoint.{k}"), v, MIN_STORAGE_GBPS, MAX_STORAGE_GBPS, " GB/s");
        }
        real("checkpoint.save_s".into(), cp.save_s, 0.0, MAX_FAILURE_SECONDS, " s");
        real("checkpoint.interval_s".into(), cp.interval_s, 1e-3, MAX_FAILURE_SECONDS, " s");
        let r = &self.restart;
        for (k, v) in
            [("detect_s", r.detect_s), ("reschedule_s", r.reschedule_s), ("init_s", r.init_s), ("load_s", r.load_s)]
        {
            real(format!("restart.{k}"), v, 0.0, MAX_FAILURE_SECONDS, " s");
        }
        for c in Cause::ALL {
            let Some(s) = self.component(c) else { continue };
            if s.shape.is_some() && s.distribution != Some(Distribution::Weibull) {
                lines.push(format!(
                    "faults.failures.{}.shape is set but the distribution is exponential: add distribution = \"weibull\" or drop shape",
                    c.key()
                ));
            }
            if self.rates == Rates::None && s.mtbf_hours.is_none() {
                lines.push(format!(
                    "faults.failures.{} has no mtbf_hours and rates = \"none\" publishes none: set mtbf_hours",
                    c.key()
                ));
            }
        }
        if lines.is_empty() { Ok(()) } else { Err(lines.join("\n")) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::Scenario;

    const BASE: &str =
        "[model]\npreset = \"tiny-gpt\"\n[cluster]\npreset = \"cpu-local\"\n[parallel]\ndp = 8\nglobal_batch = 8\n";

    #[test]
    fn llama3_defaults_give_its_published_job_mtbf() {
        // 419 unexpected interruptions in 54 days on 16,384 GPUs: 3.09 h between them.
        let p = FailureSpec::default().processes(16_384, 2_048);
        assert_eq!(p.len(), 6);
        let rate: f64 = p.iter().map(|p| p.units as f64 / p.mtbf_hours).sum();
        assert!((1.0 / rate - 54.0 * 24.0 / 419.0).abs() < 1e-9, "{}", 1.0 / rate);
        assert_eq!(LLAMA3.iter().map(|c| c.1).sum::<u32>(), 419);
    }

    #[test]
    fn a_table_round_trips_and_bad_values_name_their_key() {
        let text = format!(
            "{BASE}[faults.failures]\nrates = \"none\"\njob = {{ mtbf_hours = 3.0 }}\ngpu = {{ mtbf_hours = 1e5, distribution = \"weibull\", shape = 0.7 }}\n[faults.failures.checkpoint]\nmode = \"async\"\nsave_s = 60\n"
        );
        let s = Scenario::from_toml(&text, "t", "t", &[]).unwrap();
        let f = &s.faults.failures;
        assert_eq!(f.checkpoint.mode, Some(SaveMode::Async));
        let p = f.processes(8, 1);
        assert_eq!(p.len(), 2);
        assert_eq!((p[0].cause, p[0].units, p[0].shape), (Cause::Gpu, 8, 0.7));
        let back = Scenario::from_toml(&s.to_toml(), "t", "t", &[]).unwrap();
        assert_eq!(back.faults.failures, *f);
        for (bad, key) in [
            ("gpu = { mtbf_hours = -1.0 }", "gpu.mtbf_hours"),
            ("gpu = { mtbf_hours = 10.0, shape = 2.0 }", "gpu.shape"),
            ("nic = { mtbf_hours = 10.0, distribution = \"weibull\", shape = 0.0 }", "nic.shape"),
            ("[faults.failures.checkpoint]\nwrite_gbps = 0.0", "checkpoint.write_gbps"),
            ("[faults.failures.restart]\ndetect_s = nan", "restart.detect_s"),
        ] {
            let text = format!("{BASE}[faults.failures]\n{bad}\n");
            let e = Scenario::from_toml(&text, "t", "t", &[]).unwrap_err().to_string();
            assert!(e.contains(&format!("faults.failures.{key}")), "{bad}: {e}");
        }
    }
}
