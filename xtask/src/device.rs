//! `cargo xtask device-check`: prepares the one run a lent GPU machine gets. Builds the
//! release binary with `--features cuda` here (the device has no Rust toolchain and no
//! network), strips it into `target/device/strata` (small enough to carry), and prints the
//! command to run there: `xtask/device/check.sh`, which checks every kernel against the CPU
//! reference, probes the machine into a cluster file, fits a GPU profile (`calibrate
//! --backend cuda --out $OUT/h200-measured.toml`) and predicts the step with it beside the
//! built-in profile, trains GPT-2 124M with the CUDA executor (and the tiny GPT with it and
//! the CPU executor, to compare their losses, and as tp 2 · pp 2 · dp 2 — eight ranks on
//! the one GPU through the shared-GPU communicator —, with full recomputation, as pp 2 · vpp 2
//! interleaved and as tp 2 with sequence parallelism, each against its single rank; the tiny Llama
//! with both executors too, for the Llama pieces), times GPT-2 124M in
//! PyTorch eager and prints the table (`xtask/device/table.py`); logs under `$OUT`.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, bail};

pub fn device_check() -> anyhow::Result<()> {
    crate::cargo(&["build", "--release", "--features", "cuda", "--bin", "strata"])?;
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().context("the workspace root")?;
    let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), Into::into);
    let built = target.join("release/strata");
    let dir = root.join("target/device");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let carried = dir.join("strata");
    let status = Command::new("strip")
        .arg("-o")
        .arg(&carried)
        .arg(&built)
        .status()
        .context("running strip (binutils) on the binary")?;
    if !status.success() {
        bail!("strip {} failed ({status})", built.display());
    }
    let size = std::fs::metadata(&carried).map(|m| m.len()).unwrap_or(0);
    println!(
        "device-check is ready: {} ({:.1} MiB, release, --features cuda).\n\n\
         On the lent GPU machine, from the repository root, carrying target/device:\n\
         \x20 bash xtask/device/check.sh target/device/strata\n\n\
         (it keeps to STRATA_CHECK_BUDGET seconds, default 520: give the call a little more; on an H200 it\n\
         took 122 s. It writes summary.txt, table.txt, logs.tgz (every step's logs) and the measured\n\
         profile under $OUT)",
        carried.display(),
        size as f64 / (1u64 << 20) as f64
    );
    Ok(())
}
