//! What `--backend cuda` answers on this build and this machine, in one place: a build
//! without the `cuda` feature says so, a machine without a driver or a GPU says "no GPU
//! found" — both exit 2 (nothing ran; the input cannot be served here), never a panic.
//! The CUDA executor itself is not built yet, so `train` and `compare` refuse
//! `--backend cuda` even where a GPU is present, and say what does run.

use anyhow::bail;

/// The GPUs `--backend cuda` would use, or the exit-2 reason it cannot.
#[cfg(feature = "cuda")]
/// `instead` says what runs without one.
pub fn require_gpus(command: &str, instead: &str) -> anyhow::Result<Vec<strata_runtime::cuda::DeviceInfo>> {
    match strata_runtime::cuda::devices() {
        Ok(d) if !d.is_empty() => Ok(d),
        Ok(_) => bail!("no GPU found for {command}: the CUDA driver sees no GPU on this machine; {instead}"),
        Err(e) => bail!("no GPU found for {command}: {e}; {instead}"),
    }
}

/// The GPUs `--backend cuda` would use, or the exit-2 reason it cannot.
#[cfg(not(feature = "cuda"))]
/// `instead` says what runs without one.
pub fn require_gpus(command: &str, instead: &str) -> anyhow::Result<std::convert::Infallible> {
    bail!(
        "strata was built without CUDA: {command} needs a build with `--features cuda` \
         (cargo build --release --features cuda) and a GPU; {instead}"
    )
}

/// `--backend` of a command that executes plans: `cpu` runs, `cuda` is checked and refused
/// with the reason (the executor for GPUs is not built yet).
pub fn executor_backend(command: &str, backend: &str) -> anyhow::Result<()> {
    match backend {
        "cpu" => Ok(()),
        "cuda" => refuse_executor(command),
        other => bail!("--backend {other:?}: use cpu, or cuda"),
    }
}

/// The GPUs are there (or not, said first), but no executor runs plans on them yet.
#[cfg(feature = "cuda")]
fn refuse_executor(command: &str) -> anyhow::Result<()> {
    let gpus = require_gpus(
        &format!("{command} --backend cuda"),
        &format!("{command} --backend cpu runs the plan on CPU ranks"),
    )?;
    bail!(
        "{} GPU(s) found ({}), but the CUDA executor is not built yet: {command} --backend cuda cannot run a plan \
         on GPUs. `strata kernels --check` checks the model's CUDA kernels against the CPU reference on this GPU, and \
         `strata calibrate --backend cuda` measures its GEMMs; {command} --backend cpu runs the plan on CPU ranks",
        gpus.len(),
        gpus[0].name
    )
}

#[cfg(not(feature = "cuda"))]
fn refuse_executor(command: &str) -> anyhow::Result<()> {
    match require_gpus(
        &format!("{command} --backend cuda"),
        &format!("{command} --backend cpu runs the plan on CPU ranks"),
    )? {}
}
