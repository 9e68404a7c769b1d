//! `cargo xtask interop`: every export loaded by its framework's own code.
//!
//! Writes a matrix of scenarios × splits × targets with `strata export` into a temporary
//! directory, then runs `xtask/interop/check.py` in a cached virtualenv that holds the
//! frameworks (DeepSpeed, megatron-core, torchtitan v0.2.2, on PyPI's torch), which prints
//! one line per export — the command and what the parser made of it — and fails on any
//! rejection.
//!
//! The virtualenv lives at `$STRATA_INTEROP_VENV` (default
//! `$HOME/.cache/strata/interop-venv`) and is reused while its pins match [`PINS`]. Without
//! `python3` the check is skipped with a message, except in CI (`CI=true`), where a missing
//! tool is a failure.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, bail};

/// Installed with their dependencies.
const PINS: &[&str] = &["torch==2.15.0", "deepspeed==0.19.8", "megatron-core==0.16.1"];
/// torchtitan's config parser needs only these of its dependencies (its wheel also pulls
/// datasets, tensorboard and torchdata, which parsing never imports).
const PINS_NO_DEPS: &[&str] =
    &["torchtitan==0.2.2", "tyro==1.0.17", "docstring-parser==0.18.0", "typeguard==4.6.1", "tokenizers==0.23.3"];

/// One export of the matrix: a model on a cluster, a split, a target.
struct Case {
    model: &'static str,
    cluster: &'static str,
    nodes: u32,
    /// `[parallel]` and `[training]` lines beyond the model and cluster.
    split: &'static str,
    tp: u32,
    pp: u32,
    dp: u32,
    targets: &'static [(&'static str, bool)],
}

const CASES: &[Case] = &[
    Case {
        model: "gpt3-175b",
        cluster: "dgx-a100",
        nodes: 128,
        tp: 8,
        pp: 8,
        dp: 16,
        split: "schedule = \"interleaved\"\nvpp = 3\nzero = 1\nrecompute = \"selective\"\nsequence_parallel = true\nglobal_batch = 1536\n",
        targets: &[("megatron", false)],
    },
    Case {
        model: "gpt3-175b",
        cluster: "dgx-a100",
        nodes: 128,
        tp: 8,
        pp: 8,
        dp: 16,
        split: "schedule = \"1f1b\"\nzero = 1\nrecompute = \"full\"\nsequence_parallel = false\nglobal_batch = 1536\n",
        targets: &[("megatron", false), ("deepspeed", false)],
    },
    Case {
        model: "gpt3-175b",
        cluster: "dgx-a100",
        nodes: 128,
        tp: 8,
        pp: 1,
        dp: 128,
        split: "zero = 2\nrecompute = \"selective\"\nsequence_parallel = false\nmicro_batch = 2\nglobal_batch = 1536\n",
        targets: &[("deepspeed", false)],
    },
    Case {
        model: "llama3-70b",
        cluster: "dgx-h100",
        nodes: 32,
        tp: 8,
        pp: 4,
        dp: 8,
        split: "schedule = \"1f1b\"\nzero = 1\nrecompute = \"selective\"\nsequence_parallel = true\nglobal_batch = 512\n[training]\nflash_attention = true\n",
        targets: &[("megatron", false)],
    },
    Case {
        model: "llama3-70b",
        cluster: "dgx-h100",
        nodes: 32,
        tp: 8,
        pp: 4,
        dp: 8,
        split: "schedule = \"interleaved\"\nvpp = 5\nzero = 0\nrecompute = \"full\"\nsequence_parallel = true\nglobal_batch = 512\n[training]\nflash_attention = true\n",
        targets: &[("megatron", false), ("torchtitan", true)],
    },
    Case {
        model: "llama3-70b",
        cluster: "dgx-h100",
        nodes: 32,
        tp: 8,
        pp: 1,
        dp: 32,
        split: "zero = 3\nrecompute = \"none\"\nsequence_parallel = true\nglobal_batch = 512\n[training]\nflash_attention = true\n",
        targets: &[("torchtitan", false)],
    },
    Case {
        model: "llama3-8b",
        cluster: "dgx-a100",
        nodes: 1,
        tp: 1,
        pp: 1,
        dp: 8,
        split: "zero = 3\nrecompute = \"full\"\nsequence_parallel = false\nglobal_batch = 64\n[training]\nflash_attention = true\n",
        targets: &[("deepspeed", false), ("torchtitan", false)],
    },
    Case {
        model: "llama3-8b",
        cluster: "dgx-a100",
        nodes: 1,
        tp: 2,
        pp: 2,
        dp: 2,
        split: "schedule = \"gpipe\"\nzero = 2\nrecompute = \"none\"\nsequence_parallel = true\nmicro_batch = 2\nglobal_batch = 64\n[training]\nflash_attention = true\n",
        targets: &[("torchtitan", true)],
    },
    Case {
        model: "llama3-405b",
        cluster: "dgx-h100",
        nodes: 2048,
        tp: 8,
        pp: 16,
        dp: 128,
        split: "schedule = \"1f1b\"\nzero = 1\nrecompute = \"selective\"\nsequence_parallel = true\nglobal_batch = 2048\n[training]\nflash_attention = true\n",
        targets: &[("megatron", false)],
    },
    Case {
        model: "llama3-405b",
        cluster: "dgx-h100",
        nodes: 2048,
        tp: 8,
        pp: 16,
        dp: 128,
        split: "schedule = \"interleaved\"\nvpp = 2\nzero = 3\nrecompute = \"full\"\nsequence_parallel = true\nglobal_batch = 2048\n[training]\nflash_attention = true\n",
        targets: &[("megatron-expect-rule", false), ("torchtitan", false)],
    },
    Case {
        model: "gpt2-350m",
        cluster: "dgx-b200",
        nodes: 1,
        tp: 2,
        pp: 1,
        dp: 4,
        split: "zero = 1\nrecompute = \"none\"\nsequence_parallel = false\nmicro_batch = 4\nglobal_batch = 64\n[training]\nflash_attention = true\ngrad_reduce_in_bf16 = true\n",
        targets: &[("megatron", false), ("deepspeed", false)],
    },
    // A mixture of experts (Megatron-LM's Mixtral example split, TP2 PP4 EP8): the MoE flags
    // are checked against Megatron-LM's flag list with the rest.
    Case {
        model: "mixtral-8x7b",
        cluster: "dgx-h100",
        nodes: 8,
        tp: 2,
        pp: 4,
        dp: 8,
        split: "ep = 8\nschedule = \"1f1b\"\nzero = 1\nrecompute = \"none\"\nsequence_parallel = true\nglobal_batch = 256\n[training]\nflash_attention = true\n",
        targets: &[("megatron", false)],
    },
    Case {
        model: "tiny-llama",
        cluster: "dgx-h100",
        nodes: 1,
        tp: 2,
        pp: 2,
        dp: 2,
        split: "schedule = \"1f1b\"\nzero = 2\nrecompute = \"selective\"\nsequence_parallel = true\nglobal_batch = 16\n",
        targets: &[("torchtitan", true)],
    },
];

pub fn interop() -> anyhow::Result<()> {
    let start = Instant::now();
    let ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let Some(python) = venv_python(ci)? else {
        return Ok(());
    };
    crate::cargo(&["build", "--release", "--bin", "strata"])?;
    let target = std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| root.join("target"));
    let strata = target.join("release").join("strata");
    let dir = std::env::temp_dir().join(format!("strata-interop-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut manifest = Vec::new();
    for (i, c) in CASES.iter().enumerate() {
        let scenario = dir.join(format!("case{i}.toml"));
        let (parallel, training) = c.split.split_once("[training]\n").unwrap_or((c.split, ""));
        let text = format!(
            "name = \"{m}-case{i}\"\n[model]\npreset = \"{m}\"\n[cluster]\npreset = \"{cl}\"\nnodes = {n}\n[parallel]\ntp = {tp}\npp = {pp}\ndp = {dp}\n{parallel}[training]\n{training}",
            m = c.model,
            cl = c.cluster,
            n = c.nodes,
            tp = c.tp,
            pp = c.pp,
            dp = c.dp
        );
        std::fs::write(&scenario, text).with_context(|| format!("writing {}", scenario.display()))?;
        for (to, lossy) in c.targets {
            if let Some(to) = to.strip_suffix("-expect-rule") {
                // A split the framework cannot run: exit 2, naming the rule.
                let out = Command::new(&strata)
                    .args(["export"])
                    .arg(&scenario)
                    .args(["--to", to])
                    .output()
                    .context("running strata export")?;
                let err = String::from_utf8_lossy(&out.stderr);
                if out.status.code() != Some(2) || !err.contains(&format!("[{to}-")) {
                    bail!(
                        "strata export {} --to {to} should exit 2 naming a {to}- rule; got {:?}: {err}",
                        scenario.display(),
                        out.status.code()
                    );
                }
                println!(
                    "ok    strata export case{i}.toml --to {to}  ->  refused, exit 2: {}",
                    err.lines().nth(1).unwrap_or("").trim()
                );
                continue;
            }
            let out_dir = dir.join(format!("case{i}-{to}"));
            let mut cmd = Command::new(&strata);
            cmd.arg("export").arg(&scenario).args(["--to", to, "--out"]).arg(&out_dir);
            if *lossy {
                cmd.arg("--lossy");
            }
            let out = cmd.output().context("running strata export")?;
            if !out.status.success() {
                bail!(
                    "strata export {} --to {to} failed: {}",
                    scenario.display(),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            let warnings = String::from_utf8_lossy(&out.stderr).lines().filter(|l| l.starts_with("warning:")).count();
            let command = format!(
                "strata export case{i}.toml ({} tp{} pp{} dp{}) --to {to}{}",
                c.model,
                c.tp,
                c.pp,
                c.dp,
                if *lossy { format!(" --lossy ({warnings} dropped)") } else { String::new() }
            );
            manifest.push(serde_json::json!({
                "target": to, "dir": out_dir, "command": command,
                "tp": c.tp, "pp": c.pp, "dp": c.dp, "gpu": gpu(c.cluster), "lossy": lossy,
            }));
        }
    }
    let manifest_path = dir.join("manifest.json");
    std::fs::write(&manifest_path, serde_json::to_string_pretty(&manifest)?).context("writing the manifest")?;
    let check = root.join("xtask/interop/check.py");
    let status = Command::new(&python)
        .arg(&check)
        .arg(&manifest_path)
        .env("DS_ACCELERATOR", "cuda")
        .status()
        .context("running check.py")?;
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!("interop: {:.1} s", start.elapsed().as_secs_f64());
    if !status.success() {
        bail!("a framework rejected an export (see the FAIL lines above)");
    }
    Ok(())
}

fn gpu(cluster: &str) -> &'static str {
    match cluster {
        "dgx-a100" => "a100-80gb",
        "dgx-h100" => "h100-sxm",
        "dgx-h200" => "h200-sxm",
        "dgx-b200" => "b200",
        _ => "cpu",
    }
}

/// The virtualenv's python, created or reused; `None` when the check is skipped.
fn venv_python(ci: bool) -> anyhow::Result<Option<PathBuf>> {
    let venv = match std::env::var_os("STRATA_INTEROP_VENV") {
        Some(v) => PathBuf::from(v),
        None => match std::env::var_os("HOME") {
            Some(h) => PathBuf::from(h).join(".cache/strata/interop-venv"),
            None => bail!("neither STRATA_INTEROP_VENV nor HOME is set: nowhere to keep the interop virtualenv"),
        },
    };
    let python = venv.join("bin/python");
    let stamp = venv.join("strata-pins.txt");
    let pins = format!("{}\n--no-deps {}\n", PINS.join(" "), PINS_NO_DEPS.join(" "));
    if python.exists() && std::fs::read_to_string(&stamp).is_ok_and(|s| s == pins) {
        eprintln!("interop: reusing the virtualenv {}", venv.display());
        return Ok(Some(python));
    }
    let host = if Command::new("python3").arg("-c").arg("import venv, ensurepip").status().is_ok_and(|s| s.success()) {
        "python3"
    } else {
        let message = "interop: python3 with venv and ensurepip is not installed; cannot load the exports with the frameworks' code";
        if ci {
            bail!("{message} (CI=true: a missing tool is a failure)");
        }
        eprintln!(
            "{message}. Skipped; install python3 and python3-venv, or point STRATA_INTEROP_VENV at a virtualenv that has {} {}.",
            PINS.join(" "),
            PINS_NO_DEPS.join(" ")
        );
        return Ok(None);
    };
    if !python.exists() {
        eprintln!("interop: creating the virtualenv {}", venv.display());
        run(Command::new(host).args(["-m", "venv"]).arg(&venv))?;
    }
    let pip = venv.join("bin/pip");
    eprintln!("interop: installing {} and {} (no dependencies)", PINS.join(" "), PINS_NO_DEPS.join(" "));
    run(Command::new(&pip).args(["install", "--quiet", "--disable-pip-version-check"]).args(PINS))?;
    run(Command::new(&pip)
        .args(["install", "--quiet", "--disable-pip-version-check", "--no-deps"])
        .args(PINS_NO_DEPS))?;
    std::fs::write(&stamp, pins).with_context(|| format!("writing {}", stamp.display()))?;
    Ok(Some(python))
}

fn run(cmd: &mut Command) -> anyhow::Result<()> {
    let status = cmd.status().with_context(|| format!("running {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed ({status})");
    }
    Ok(())
}
