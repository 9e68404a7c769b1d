//! Scenario files: a training job as TOML — model × cluster × parallel split × training.
//!
//! The contract (DESIGN.md): four tables, `[model]`, `[cluster]`, `[parallel]`,
//! `[training]`, plus an optional top-level `name`. `preset = "…"` in `[model]` or
//! `[cluster]` starts from a built-in spec and explicit keys override it. Unknown keys are
//! errors that name the key and the line. Command-line overrides (`--set parallel.tp=4`)
//! are applied to the parsed document before it is resolved: the value is read as a TOML
//! value, and a bare word is taken as a string (`--set parallel.schedule=1f1b`).
//!
//! Resolution turns the optional "raw" tables into a fully specified [`Scenario`] and
//! validates it; a `Scenario` in hand is always valid.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::cluster::{CLUSTER_PRESETS, ClusterSpec, Fabric, Routing};
use crate::faults::Faults;
use crate::framework::Framework;
use crate::hardware::GpuKind;
use crate::model::{Activation, Family, MODEL_PRESETS, ModelSpec};
use crate::parallel::{ConfigError, ParallelConfig, Recompute, Schedule};

/// A fully resolved, validated training job.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Scenario {
    pub name: String,
    pub model: ModelSpec,
    pub cluster: ClusterSpec,
    pub parallel: ParallelConfig,
    pub training: TrainingConfig,
    /// What-ifs and failure processes (`[faults]`); fault-free by default (and absent from
    /// plan files written before it existed).
    #[serde(default, skip_serializing_if = "Faults::is_empty")]
    pub faults: Faults,
}

/// What can go wrong reading a scenario. Every message says what to do.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    #[error("cannot read scenario {path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("scenario {origin} is not valid: {message}")]
    Parse { origin: String, message: String },
    #[error("scenario {origin}: unknown {section}.preset = \"{name}\"; known presets: {known}")]
    UnknownPreset { origin: String, section: &'static str, name: String, known: String },
    #[error("scenario {origin}: {key} is missing; {}", missing_hint(section, key))]
    Missing { origin: String, section: &'static str, key: String },
    #[error("bad override --set {spec}: {reason}")]
    BadOverride { spec: String, reason: String },
    #[error("scenario {origin} describes an impossible job:\n{message}")]
    Invalid { origin: String, message: String, config: Option<ConfigError> },
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawScenario {
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    description: Option<String>,
    #[serde(default)]
    model: RawModel,
    #[serde(default)]
    cluster: RawCluster,
    #[serde(default)]
    parallel: RawParallel,
    #[serde(default)]
    training: RawTraining,
    #[serde(default, skip_serializing_if = "Faults::is_empty")]
    faults: Faults,
}

macro_rules! raw_table {
    ($raw:ident { $($field:ident : $ty:ty),* $(,)? }) => {
        #[derive(Clone, Debug, Default, Serialize, Deserialize)]
        #[serde(deny_unknown_fields)]
        struct $raw {
            $(#[serde(default, skip_serializing_if = "Option::is_none")] $field: Option<$ty>,)*
        }
    };
}

raw_table!(RawModel {
    preset: String,
    name: String,
    family: Family,
    layers: u32,
    hidden: u32,
    heads: u32,
    kv_heads: u32,
    head_dim: u32,
    ffn_hidden: u32,
    vocab: u32,
    seq_len: u32,
    activation: Activation,
    dropout: f64,
    rope_base: f64,
    moe: moe_raw::RawMoe,
    mla: moe_raw::RawMla,
    mtp_layers: u32,
});
raw_table!(RawCluster {
    preset: String,
    name: String,
    gpu: String,
    nodes: u32,
    gpus_per_node: u32,
    nics_per_node: u32,
    nic_gbps: f64,
    fabric: Fabric,
    oversubscription: f64,
    routing: Routing,
    switch_radix: u32,
    nodes_per_unit: u32,
    switch_latency_ns: u64,
    nic_efficiency: f64,
});
raw_table!(RawParallel {
    tp: u32,
    pp: u32,
    dp: u32,
    cp: u32,
    ep: u32,
    cp_comm: crate::parallel::CpComm,
    vpp: u32,
    schedule: Schedule,
    micro_batch: u32,
    global_batch: u32,
    zero: u8,
    recompute: Recompute,
    sequence_parallel: bool,
    grad_bucket_mb: f64,
    overlap_grad_reduce: bool,
    overlap_param_gather: bool,
    moe_a2a_overlap: bool,
    tp_comm_overlap: bool,
});
raw_table!(RawTraining {
    dtype: Dtype,
    steps: u32,
    seed: u64,
    lr: f64,
    warmup_steps: u32,
    weight_decay: f64,
    grad_clip: f64,
    flash_attention: bool,
    framework: Framework,
    grad_reduce_in_bf16: bool,
});

impl Scenario {
    /// Reads, overrides, resolves and validates a scenario file.
    pub fn load(path: &Path, overrides: &[String]) -> Result<Scenario, ScenarioError> {
        let origin = path.display().to_string();
        let text =
            std::fs::read_to_string(path).map_err(|source| ScenarioError::Io { path: origin.clone(), source })?;
        let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        Scenario::from_toml(&text, &origin, &stem, overrides)
    }

    /// Parses scenario text. `origin` names it in errors; `default_name` is used when the
    /// file has no top-level `name`.
    pub fn from_toml(
        text: &str,
        origin: &str,
        default_name: &str,
        overrides: &[String],
    ) -> Result<Scenario, ScenarioError> {
        Scenario::from_toml_with(text, origin, default_name, overrides, Split::Checked)
    }

    fn from_toml_with(
        text: &str,
        origin: &str,
        default_name: &str,
        overrides: &[String],
        split: Split,
    ) -> Result<Scenario, ScenarioError> {
        // A parse error quotes the offending line, which may be megabytes long: an excerpt.
        let parse = |message: String| ScenarioError::Parse { origin: origin.to_string(), message: short(&message) };
        // First pass on the text itself, so unknown keys and type errors carry a line.
        let mut raw: RawScenario = toml::from_str(text).map_err(|e| parse(e.to_string()))?;
        if !overrides.is_empty() {
            let mut doc: toml::Table = toml::from_str(text).map_err(|e| parse(e.to_string()))?;
            for spec in overrides {
                apply_override(&mut doc, spec)?;
            }
            raw = RawScenario::deserialize(toml::Value::Table(doc)).map_err(|e| ScenarioError::BadOverride {
                spec: short(&overrides.join(" --set ")),
                reason: short(e.to_string().trim()),
            })?;
        }
        resolve(raw, origin, default_name, split)
    }

    /// Writes the scenario back as explicit TOML (no presets), loadable by [`Scenario::from_toml`].
    pub fn to_toml(&self) -> String {
        let m = &self.model;
        let c = &self.cluster;
        let p = &self.parallel;
        let t = &self.training;
        let raw = RawScenario {
            name: Some(self.name.clone()),
            description: None,
            model: RawModel {
                preset: None,
                name: Some(m.name.clone()),
                family: Some(m.family),
                layers: Some(m.layers),
                hidden: Some(m.hidden),
                heads: Some(m.heads),
                kv_heads: Some(m.kv_heads),
                head_dim: m.head_dim,
                ffn_hidden: Some(m.ffn_hidden),
                vocab: Some(m.vocab),
                seq_len: Some(m.seq_len),
                activation: Some(m.activation),
                dropout: Some(m.dropout),
                rope_base: Some(m.rope_base),
                moe: m.moe.as_ref().map(Into::into),
                mla: m.mla.as_ref().map(Into::into),
                mtp_layers: Some(m.mtp_layers).filter(|l| *l != 0),
            },
            cluster: RawCluster {
                preset: None,
                name: Some(c.name.clone()),
                gpu: Some(c.gpu.key().to_string()),
                nodes: Some(c.nodes),
                gpus_per_node: Some(c.gpus_per_node),
                nics_per_node: Some(c.nics_per_node),
                nic_gbps: Some(c.nic_gbps),
                fabric: Some(c.fabric),
                oversubscription: Some(c.oversubscription),
                routing: Some(c.routing),
                switch_radix: Some(c.switch_radix),
                nodes_per_unit: Some(c.nodes_per_unit),
                switch_latency_ns: Some(c.switch_latency_ns),
                nic_efficiency: Some(c.nic_efficiency).filter(|e| *e != 1.0),
            },
            parallel: RawParallel {
                tp: Some(p.tp),
                pp: Some(p.pp),
                dp: Some(p.dp),
                cp: Some(p.cp).filter(|c| *c != 1),
                ep: Some(p.ep).filter(|e| *e != 1),
                cp_comm: Some(p.cp_comm).filter(|c| *c != crate::parallel::CpComm::Ring),
                vpp: Some(p.vpp),
                schedule: Some(p.schedule),
                micro_batch: Some(p.micro_batch),
                global_batch: Some(p.global_batch),
                zero: Some(p.zero),
                recompute: Some(p.recompute),
                sequence_parallel: Some(p.sequence_parallel),
                grad_bucket_mb: Some(p.grad_bucket_mb),
                overlap_grad_reduce: Some(p.overlap_grad_reduce),
                overlap_param_gather: Some(p.overlap_param_gather),
                moe_a2a_overlap: Some(p.moe_a2a_overlap).filter(|o| *o),
                tp_comm_overlap: p.tp_comm_overlap,
            },
            training: RawTraining {
                dtype: Some(t.dtype),
                steps: Some(t.steps),
                seed: Some(t.seed),
                lr: Some(t.lr),
                warmup_steps: Some(t.warmup_steps),
                weight_decay: Some(t.weight_decay),
                grad_clip: Some(t.grad_clip),
                flash_attention: Some(t.flash_attention),
                framework: Some(t.framework),
                grad_reduce_in_bf16: Some(t.grad_reduce_in_bf16),
            },
            faults: self.faults.clone(),
        };
        toml::to_string(&raw).expect("a resolved scenario always serialises")
    }

    /// Validates a scenario built in code (the search does this for every candidate).
    pub fn validate(&self) -> Result<(), ScenarioError> {
        validate(self, &self.name)
    }

    /// Whether the tensor-parallel collectives overlap their GEMMs
    /// (`parallel.tp_comm_overlap`). Unset ("auto"), it is on where Megatron-LM runs it in
    /// NVIDIA's published H100 configurations (the Megatron-LM README's weak-scaling runs
    /// pass `--tp-comm-overlap`): framework Megatron-LM, tp > 1 with sequence parallelism,
    /// a Hopper or newer GPU. It stays off on Ampere, whose published Megatron-LM runs
    /// predate Transformer Engine's userbuffers, and under every other framework (DeepSpeed
    /// has none; torchtitan's async tensor parallelism needs `torch.compile` and is off by
    /// default; Strata's executors run each collective whole). The export writes the flag
    /// when this is on, so what is predicted is what runs.
    pub fn tp_comm_overlap(&self) -> bool {
        if !crate::framework::mechanics::Mechanic::TpCommOverlap.on() {
            return false;
        }
        let p = &self.parallel;
        p.tp_comm_overlap.unwrap_or_else(|| {
            self.training.framework == crate::framework::Framework::Megatron
                && p.tp > 1
                && p.sequence_parallel
                && self.cluster.gpu.hopper_or_newer()
        })
    }

    /// The ZeRO stage the framework runs: `parallel.zero`, except where DeepSpeed's
    /// `BF16_Optimizer` runs at stage 0 (bf16 under a pipeline,
    /// [`crate::framework::Framework::bf16_optimizer`]): it partitions the fp32 master
    /// weights and Adam over the data-parallel ranks, all-reduces the gradients whole and
    /// all-gathers the bf16 weights after its step — stage 1's mechanics, so the plan, the
    /// search and the executors run it as stage 1. The export and the rules keep
    /// `parallel.zero`, what the user configures.
    pub fn zero_stage(&self) -> u8 {
        let z = self.parallel.zero;
        if z == 0 && self.training.framework.bf16_optimizer(self).is_some() { 1 } else { z }
    }

    /// Tokens processed per step: B · s.
    pub fn tokens_per_step(&self) -> u64 {
        self.parallel.global_batch as u64 * self.model.seq_len as u64
    }
}

/// Reads the `[cluster]` table of a TOML file (a scenario, or a file with only a cluster),
/// resolving its preset and checking it.
pub fn load_cluster(path: &Path) -> Result<ClusterSpec, ScenarioError> {
    let origin = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| ScenarioError::Io { path: origin.clone(), source })?;
    let raw: RawScenario = toml::from_str(&text)
        .map_err(|e| ScenarioError::Parse { origin: origin.clone(), message: short(&e.to_string()) })?;
    let cluster = resolve_cluster(raw.cluster, &origin)?;
    cluster.check().map_err(|message| ScenarioError::Invalid { origin, message, config: None })?;
    Ok(cluster)
}

fn resolve(raw: RawScenario, origin: &str, default_name: &str, split: Split) -> Result<Scenario, ScenarioError> {
    let missing = |section, key: &str| missing(origin, section, key);
    let unknown = |section, name: &str, known: &[&str]| unknown_preset(origin, section, name, known);

    // Model: preset, then explicit keys.
    let rm = raw.model;
    let base = match &rm.preset {
        Some(p) => Some(ModelSpec::preset(p).ok_or_else(|| unknown("model", p, MODEL_PRESETS))?),
        None => None,
    };
    macro_rules! pick {
        ($raw:expr, $base:expr, $section:literal, $field:ident) => {
            match ($raw.$field.clone(), $base.as_ref()) {
                (Some(v), _) => v,
                (None, Some(b)) => b.$field.clone(),
                (None, None) => return Err(missing($section, stringify!($field))),
            }
        };
    }
    let model = ModelSpec {
        name: rm.name.clone().or_else(|| rm.preset.clone()).unwrap_or_else(|| "custom".into()),
        family: pick!(rm, base, "model", family),
        layers: pick!(rm, base, "model", layers),
        hidden: pick!(rm, base, "model", hidden),
        heads: pick!(rm, base, "model", heads),
        kv_heads: rm
            .kv_heads
            .or(base.as_ref().map(|b| b.kv_heads))
            .or(rm.heads)
            .ok_or_else(|| missing("model", "kv_heads"))?,
        // Absent = h / heads; a preset's own (Qwen3's 128) stays when h or heads change.
        head_dim: rm.head_dim.or(base.as_ref().and_then(|b| b.head_dim)),
        ffn_hidden: rm
            .ffn_hidden
            .or(base.as_ref().map(|b| b.ffn_hidden))
            .or(rm.hidden.map(|h| h.saturating_mul(4)))
            .ok_or_else(|| missing("model", "ffn_hidden"))?,
        vocab: pick!(rm, base, "model", vocab),
        seq_len: pick!(rm, base, "model", seq_len),
        activation: rm
            .activation
            .or(base.as_ref().map(|b| b.activation))
            .unwrap_or(if rm.family == Some(Family::Llama) { Activation::Swiglu } else { Activation::Gelu }),
        dropout: 0.0,
        rope_base: rm.rope_base.or(base.as_ref().map(|b| b.rope_base)).unwrap_or_else(crate::model::default_rope_base),
        moe: match rm.moe.clone() {
            Some(raw) => Some(raw.resolve(base.as_ref().and_then(|b| b.moe.as_ref()), origin, "model.moe")?),
            None => base.as_ref().and_then(|b| b.moe.clone()),
        },
        mla: match rm.mla.clone() {
            Some(raw) => Some(raw.resolve(base.as_ref().and_then(|b| b.mla.as_ref()), origin, "model.mla")?),
            None => base.as_ref().and_then(|b| b.mla.clone()),
        },
        mtp_layers: rm.mtp_layers.or(base.as_ref().map(|b| b.mtp_layers)).unwrap_or(0),
    };

    let cluster = resolve_cluster(raw.cluster, origin)?;
    let single = cluster.gpu == GpuKind::Cpu;
    // Dropout: as given; else none on CPU ranks (the CPU executor has no dropout, so its plans
    // hold no masks), else Megatron's 0.1 for GPT (the preset's value) and none for Llama.
    let family_dropout = if model.family == Family::Gpt { 0.1 } else { 0.0 };
    let model = ModelSpec {
        dropout: rm.dropout.unwrap_or(if single { 0.0 } else { base.as_ref().map_or(family_dropout, |b| b.dropout) }),
        ..model
    };

    // Parallel: defaults, dp derived from the GPU count when absent.
    let rp = raw.parallel;
    let d = ParallelConfig::default();
    let tp = rp.tp.unwrap_or(d.tp);
    let pp = rp.pp.unwrap_or(d.pp);
    let cp = rp.cp.unwrap_or(d.cp);
    let dp = match rp.dp {
        Some(dp) => dp,
        None => {
            let grid = tp as u64 * cp as u64 * pp as u64;
            let derivable = grid != 0 && cluster.gpus().is_multiple_of(grid);
            if !derivable && split == Split::Unchecked {
                // Any dp: the split is not checked, and the search replaces it.
                1
            } else if !derivable {
                return Err(ScenarioError::Invalid {
                    origin: origin.to_string(),
                    message: format!(
                        "parallel.dp is absent and cannot be derived: the cluster's {} GPUs are not divisible by tp · cp · pp = {tp} · {cp} · {pp} = {grid}; set parallel.dp or change tp/cp/pp",
                        cluster.gpus()
                    ),
                    config: None,
                });
            } else {
                u32::try_from(cluster.gpus() / grid).unwrap_or(u32::MAX)
            }
        }
    };
    let vpp = rp.vpp.unwrap_or(d.vpp);
    let parallel = ParallelConfig {
        tp,
        pp,
        dp,
        cp,
        ep: rp.ep.unwrap_or(d.ep),
        cp_comm: rp.cp_comm.unwrap_or(d.cp_comm),
        vpp,
        schedule: rp.schedule.unwrap_or(if vpp > 1 { Schedule::chunked_default() } else { d.schedule }),
        micro_batch: rp.micro_batch.unwrap_or(d.micro_batch),
        global_batch: rp.global_batch.ok_or_else(|| missing("parallel", "global_batch"))?,
        zero: rp.zero.unwrap_or(d.zero),
        recompute: rp.recompute.unwrap_or(d.recompute),
        sequence_parallel: rp.sequence_parallel.unwrap_or(d.sequence_parallel),
        grad_bucket_mb: rp.grad_bucket_mb.unwrap_or(d.grad_bucket_mb),
        overlap_grad_reduce: rp.overlap_grad_reduce.unwrap_or(d.overlap_grad_reduce),
        overlap_param_gather: rp.overlap_param_gather.unwrap_or(d.overlap_param_gather),
        moe_a2a_overlap: rp.moe_a2a_overlap.unwrap_or(d.moe_a2a_overlap),
        tp_comm_overlap: rp.tp_comm_overlap,
    };

    let rt = raw.training;
    let td = TrainingConfig::default();
    let training = TrainingConfig {
        dtype: rt.dtype.unwrap_or(if single { Dtype::Fp32 } else { td.dtype }),
        steps: rt.steps.unwrap_or(td.steps),
        seed: rt.seed.unwrap_or(td.seed),
        lr: rt.lr.unwrap_or(td.lr),
        warmup_steps: rt.warmup_steps.unwrap_or(td.warmup_steps),
        weight_decay: rt.weight_decay.unwrap_or(td.weight_decay),
        grad_clip: rt.grad_clip.unwrap_or(td.grad_clip),
        // Fused attention unless set: the default of Megatron-LM (`--attention-backend auto`),
        // DeepSpeed's and torchtitan's models (SDPA) on GPUs; the CPU executor has none.
        flash_attention: rt.flash_attention.unwrap_or(!single),
        framework: rt.framework.unwrap_or(if single { Framework::Strata } else { td.framework }),
        grad_reduce_in_bf16: rt.grad_reduce_in_bf16.unwrap_or(td.grad_reduce_in_bf16),
    };
    let name = raw.name.unwrap_or_else(|| default_name.to_string());
    let scenario = Scenario { name, model, cluster, parallel, training, faults: raw.faults };
    match validate(&scenario, origin) {
        // Only the split's rules broke (they are checked last, once all else holds).
        Err(ScenarioError::Invalid { config: Some(_), .. }) if split == Split::Unchecked => {}
        r => r?,
    }
    Ok(scenario)
}

/// Resolves a `[cluster]` table: preset, then explicit keys.
fn resolve_cluster(rc: RawCluster, origin: &str) -> Result<ClusterSpec, ScenarioError> {
    let missing = |section, key: &str| missing(origin, section, key);
    let unknown = |section, name: &str, known: &[&str]| unknown_preset(origin, section, name, known);
    macro_rules! pick {
        ($raw:expr, $base:expr, $section:literal, $field:ident) => {
            match ($raw.$field.clone(), $base.as_ref()) {
                (Some(v), _) => v,
                (None, Some(b)) => b.$field.clone(),
                (None, None) => return Err(missing($section, stringify!($field))),
            }
        };
    }
    let cbase = match &rc.preset {
        Some(p) => Some(ClusterSpec::preset(p).ok_or_else(|| unknown("cluster", p, CLUSTER_PRESETS))?),
        None => None,
    };
    let gpu = match (&rc.gpu, &cbase) {
        (Some(g), _) => GpuKind::from_key(g).ok_or_else(|| ScenarioError::Parse {
            origin: origin.to_string(),
            message: format!(
                "cluster.gpu = \"{}\" is not in the catalog; known GPUs: {}",
                short(g),
                crate::hardware::GPU_KINDS.iter().map(|k| k.key()).collect::<Vec<_>>().join(", ")
            ),
        })?,
        (None, Some(b)) => b.gpu,
        (None, None) => return Err(missing("cluster", "gpu")),
    };
    let single = gpu == GpuKind::Cpu;
    let cluster = ClusterSpec {
        name: rc.name.clone().or_else(|| rc.preset.clone()).unwrap_or_else(|| "custom".into()),
        gpu,
        nodes: rc.nodes.or(cbase.as_ref().map(|b| b.nodes)).unwrap_or(1),
        gpus_per_node: pick!(rc, cbase, "cluster", gpus_per_node),
        nics_per_node: rc.nics_per_node.or(cbase.as_ref().map(|b| b.nics_per_node)).unwrap_or(if single {
            0
        } else {
            8
        }),
        nic_gbps: rc.nic_gbps.or(cbase.as_ref().map(|b| b.nic_gbps)).unwrap_or(if single { 0.0 } else { 400.0 }),
        fabric: rc.fabric.or(cbase.as_ref().map(|b| b.fabric)).unwrap_or(Fabric::RailOptimized),
        oversubscription: rc.oversubscription.or(cbase.as_ref().map(|b| b.oversubscription)).unwrap_or(1.0),
        routing: rc.routing.or(cbase.as_ref().map(|b| b.routing)).unwrap_or(Routing::Adaptive),
        switch_radix: rc.switch_radix.or(cbase.as_ref().map(|b| b.switch_radix)).unwrap_or(64),
        nodes_per_unit: rc.nodes_per_unit.or(cbase.as_ref().map(|b| b.nodes_per_unit)).unwrap_or(32),
        switch_latency_ns: rc.switch_latency_ns.or(cbase.as_ref().map(|b| b.switch_latency_ns)).unwrap_or(200),
        nic_efficiency: rc.nic_efficiency.or(cbase.as_ref().map(|b| b.nic_efficiency)).unwrap_or(1.0),
    };
    Ok(cluster)
}

fn validate(s: &Scenario, origin: &str) -> Result<(), ScenarioError> {
    let mut lines = Vec::new();
    if let Err(e) = s.model.check() {
        lines.push(e);
    }
    if let Err(e) = s.cluster.check() {
        lines.push(e);
    }
    let t = &s.training;
    if t.steps == 0 {
        lines.push("training.steps = 0: a run needs at least one step".to_string());
    }
    if !(t.lr > 0.0 && t.lr.is_finite()) {
        lines.push(format!("training.lr = {}: the learning rate must be a positive number", t.lr));
    }
    if let Err(e) = s.faults.check_step(s.cluster.gpus()) {
        lines.push(e);
    }
    if let Err(e) = crate::limits::check_training(t) {
        lines.push(e);
    } else if !(t.weight_decay >= 0.0 && t.grad_clip >= 0.0) {
        lines.push(format!(
            "training.weight_decay = {} and training.grad_clip = {} must not be negative",
            t.weight_decay, t.grad_clip
        ));
    }
    if let Err(e) = s.faults.failures.check() {
        lines.push(e);
    }
    // The split rules only make sense on a well-formed model and cluster.
    let mut config = if lines.is_empty() { s.parallel.validate(&s.model, &s.cluster).err() } else { None };
    if lines.is_empty() {
        let precision = training::precision_violations(t, &s.cluster);
        if !precision.is_empty() {
            let c = config.get_or_insert_with(|| ConfigError { violations: Vec::new() });
            c.violations.extend(precision);
        }
    }
    // The framework's rules only make sense on a split that is valid in itself.
    if lines.is_empty() && config.is_none() {
        config = s.training.framework.check(s).err();
    }
    if let Some(c) = &config {
        lines.push(c.to_string());
    }
    // The work budget, once every part is within its own limits.
    if lines.is_empty()
        && let Err(e) = crate::limits::check_work(s)
    {
        lines.push(e);
    }
    if lines.is_empty() {
        Ok(())
    } else {
        Err(ScenarioError::Invalid { origin: origin.to_string(), message: lines.join("\n"), config })
    }
}

mod input;
pub mod jobs;
mod moe_raw;
mod training;
pub use training::{Dtype, TrainingConfig, precision_violations};
mod placement;
mod search_base;

use input::{apply_override, missing, missing_hint, short, unknown_preset};
use search_base::Split;

#[cfg(test)]
mod tests;
