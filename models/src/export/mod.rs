//! Launch files for the frameworks people train with: a scenario's split written as
//! Megatron-LM arguments ([`megatron`]), a DeepSpeed JSON config ([`deepspeed`]) or a
//! torchtitan job TOML ([`torchtitan`]).
//!
//! Pure functions, scenario → files. Two things can stop an export, and neither is ever
//! silent:
//! - the framework cannot **run** the split (ZeRO-2 beside DeepSpeed's pipeline, GPipe in
//!   Megatron-LM): [`ExportError::Unrunnable`], with the rule ids of
//!   [`Framework::violations`];
//! - the framework runs it, but its files cannot **say** one of the scenario's settings
//!   (torchtitan has no GPT model and no gradient-bucket key, DeepSpeed's JSON no
//!   attention-core recomputation): each such setting is a [`Dropped`], and the export is
//!   [`ExportError::Inexpressible`] unless the caller accepts the loss (`--lossy`), when the
//!   files are written without it and every dropped setting is reported.
//!
//! Every writer reads the facts of `docs/frameworks.md` (CLI names, JSON keys, TOML
//! sections, at the versions named there); `cargo xtask interop` loads every export with
//! the framework's own parser.

pub mod deepspeed;
pub mod megatron;
pub mod torchtitan;

use crate::framework::Framework;
use crate::parallel::ConfigError;
use crate::scenario::Scenario;

/// One file of an export.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct File {
    /// File name, relative to the output directory (`megatron-args.txt`).
    pub name: &'static str,
    pub text: String,
}

/// A scenario setting the target's files cannot express.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Dropped {
    /// The setting and its value, as a scenario writes it (`parallel.grad_bucket_mb = 40`).
    pub setting: String,
    /// Why the target cannot say it, and what its files do instead.
    pub reason: String,
}

impl std::fmt::Display for Dropped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.setting, self.reason)
    }
}

/// What a writer produced: the files, and what they leave out.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Export {
    pub framework: Framework,
    pub files: Vec<File>,
    /// Settings the files do not carry (empty unless the export was lossy).
    pub dropped: Vec<Dropped>,
}

/// Why a scenario has no export for a framework.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("{} cannot be exported: only megatron, deepspeed and torchtitan are export targets", .0.name())]
    NotATarget(Framework),
    #[error("{framework} cannot run this split:\n{}", rules(.error))]
    Unrunnable { framework: &'static str, error: ConfigError },
    #[error(
        "{framework}'s launch files cannot express {} of this scenario's settings (change them, or pass --lossy to export without them):\n{}",
        .dropped.len(),
        .dropped.iter().map(|d| format!("  {d}")).collect::<Vec<_>>().join("\n")
    )]
    Inexpressible { framework: &'static str, dropped: Vec<Dropped> },
}

fn rules(e: &ConfigError) -> String {
    e.violations.iter().map(|v| format!("  [{}] {}", v.rule, v.message)).collect::<Vec<_>>().join("\n")
}

/// The export of `s` for `to`. The split is checked against `to`'s rules (as if
/// `training.framework = to`); settings `to` cannot express are an error unless `lossy`.
pub fn export(s: &Scenario, to: Framework, lossy: bool) -> Result<Export, ExportError> {
    let mut s = s.clone();
    s.training.framework = to;
    to.check(&s).map_err(|error| ExportError::Unrunnable { framework: to.name(), error })?;
    let (files, dropped) = match to {
        Framework::Megatron => megatron::write(&s),
        Framework::DeepSpeed => deepspeed::write(&s),
        Framework::Torchtitan => torchtitan::write(&s),
        Framework::Strata => return Err(ExportError::NotATarget(to)),
    };
    if !dropped.is_empty() && !lossy {
        return Err(ExportError::Inexpressible { framework: to.name(), dropped });
    }
    Ok(Export { framework: to, files, dropped })
}

/// The gradient bucket in elements: `grad_bucket_mb` MiB of gradients of the dtype the
/// plan reduces them in (Megatron-LM's `--ddp-bucket-size` and DeepSpeed's
/// `reduce_bucket_size` count elements, not bytes).
pub fn bucket_elements(s: &Scenario) -> u64 {
    let bytes = (s.parallel.grad_bucket_mb * 1024.0 * 1024.0) as u64;
    bytes / grad_reduce_bytes(s).max(1)
}

/// Bytes of one gradient element as the data-parallel reduction moves it, as the plan
/// moves it: the framework's reduction dtype ([`crate::accounting::states`]: Megatron-LM's
/// fp32 main gradients unless `training.grad_reduce_in_bf16`, DeepSpeed's bf16 buckets,
/// FSDP2's float32 `mixed_precision_reduce`).
pub fn grad_reduce_bytes(s: &Scenario) -> u64 {
    crate::accounting::states::scenario_layout(s).grad_reduce.bytes()
}

/// Layers of each virtual stage, in virtual-stage order (chunk-major: virtual stage
/// `c · pp + r` is chunk `c` of pipeline rank `r`, as Megatron-LM's layout and
/// torchtitan's model parts both count).
pub fn vstage_layers(s: &Scenario) -> Vec<std::ops::Range<u32>> {
    (0..s.parallel.pipeline().vstages()).map(|v| s.parallel.chunk_layers(&s.model, v)).collect()
}

/// Whether every virtual stage holds the same number of layers.
pub fn even_split(s: &Scenario) -> bool {
    let v = vstage_layers(s);
    v.iter().all(|r| r.len() == v[0].len())
}

#[cfg(test)]
mod moe_tests;
#[cfg(test)]
mod tests;
