//! `strata export`: a scenario's split as the launch files of the framework that will run
//! it — Megatron-LM arguments and launch script, a DeepSpeed config, a torchtitan job TOML
//! ([`strata_models::export`]). The split is checked against the target's rules first; a
//! setting the target's files cannot express is an error, or with `--lossy` one warning
//! line per dropped setting.

use std::path::PathBuf;

use anyhow::Context;
use strata_models::export::{self, Export};
use strata_models::{Framework, ScenarioError};

use crate::common::{self, ScenarioArgs};

/// An export target.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// Megatron-LM: megatron-args.txt and megatron-launch.sh (torchrun pretrain_gpt.py).
    Megatron,
    /// DeepSpeed: deepspeed.json and deepspeed-notes.md (what belongs in the script).
    Deepspeed,
    /// torchtitan v0.2.2: torchtitan.toml.
    Torchtitan,
}

impl Target {
    pub fn framework(self) -> Framework {
        match self {
            Target::Megatron => Framework::Megatron,
            Target::Deepspeed => Framework::DeepSpeed,
            Target::Torchtitan => Framework::Torchtitan,
        }
    }
}

#[derive(clap::Args, Debug)]
#[command(
    after_help = "Examples:\n  strata export scenarios/gpt3-175b-1024xa100.toml --to megatron --out out/gpt3\n  strata export scenarios/gpt3-175b-1024xa100.toml --to deepspeed --set parallel.pp=1 --set parallel.zero=2 --set parallel.sequence_parallel=false --set parallel.tp=8 --set parallel.dp=128\n  strata export scenarios/llama3-405b-16384xh100.toml --to torchtitan --lossy\n\nThe split is checked as if training.framework were the target: a split the framework cannot run exits with code 2 naming the rule (e.g. deepspeed-zero-pp). A setting the target's files cannot say (torchtitan has no gradient-bucket key) is an error naming it; --lossy writes the files without it and prints one warning line per dropped setting."
)]
pub struct Args {
    #[command(flatten)]
    pub scenario: ScenarioArgs,
    /// The framework to write launch files for.
    #[arg(long, value_enum)]
    pub to: Target,
    /// Directory to write the files to (created if needed). Without it, the files are printed.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Write the files even if the target cannot express some settings, warning once per dropped setting.
    #[arg(long)]
    pub lossy: bool,
    /// Print the export (files, their text, dropped settings) as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let to = args.to.framework();
    // Checked as the target runs it: its rules, and its defaults.
    let mut scenario_args = args.scenario.clone();
    scenario_args.overrides.push(format!("training.framework={}", to.key()));
    let s = match scenario_args.load() {
        Ok(s) => s,
        Err(e) => return Err(with_rules(e, to)),
    };
    let export = export::export(&s, to, args.lossy)?;
    if let Some(dir) = &args.out {
        write_files(dir, &export)?;
    }
    for d in &export.dropped {
        eprintln!("warning: --lossy: {} export drops {d}", to.name());
    }
    if args.json {
        return common::print_json(&export);
    }
    match &args.out {
        Some(dir) => {
            println!("wrote {}: {}", dir.display(), export.files.iter().map(|f| f.name).collect::<Vec<_>>().join(", "))
        }
        None => {
            for f in &export.files {
                println!("==> {} <==\n{}", f.name, f.text);
            }
        }
    }
    Ok(())
}

/// Writes an export's files into `dir` (a failed write exits 1 naming the path).
pub fn write_files(dir: &std::path::Path, export: &Export) -> anyhow::Result<()> {
    common::create_dir(dir)?;
    for f in &export.files {
        let path = dir.join(f.name);
        common::write_file(&path, &f.text)?;
        if f.name.ends_with(".sh") {
            executable(&path)?;
        }
    }
    Ok(())
}

#[cfg(unix)]
fn executable(path: &std::path::Path) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
        .with_context(|| format!("making {} executable", path.display()))
}

#[cfg(not(unix))]
fn executable(_: &std::path::Path) -> anyhow::Result<()> {
    Ok(())
}

/// A scenario the target cannot run, with the rule ids in the message.
fn with_rules(e: anyhow::Error, to: Framework) -> anyhow::Error {
    if let Some(ScenarioError::Invalid { config: Some(c), .. }) = e.downcast_ref::<ScenarioError>() {
        let rules = c.violations.iter().map(|v| format!("  [{}] {}", v.rule, v.message)).collect::<Vec<_>>();
        return anyhow::anyhow!(
            "cannot export to {}: the split breaks {} rule(s):\n{}",
            to.name(),
            rules.len(),
            rules.join("\n")
        );
    }
    e
}
