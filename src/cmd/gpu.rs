//! What `--backend cuda` answers on this build and this machine, in one place: a build
//! without the `cuda` feature says so, a machine without a driver or a GPU says "no GPU
//! found" — both exit 2 (nothing ran; the input cannot be served here), never a panic.
//! Where a GPU is present, `train` and `compare --backend cuda` run the CUDA executor (one
//! GPU so far).

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

/// Where a command that executes plans runs them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Cpu,
    /// GPU `ordinal` through the CUDA executor (one GPU so far).
    #[cfg(feature = "cuda")]
    Cuda {
        ordinal: usize,
    },
}

/// `--backend` of a command that executes plans: `cpu` runs; `cuda` needs a build with the
/// `cuda` feature and a GPU (else exit 2 with the reason); `strata train` and `strata
/// compare` then run the plan on GPU 0 through the CUDA executor.
pub fn executor_backend(command: &str, backend: &str) -> anyhow::Result<Backend> {
    match backend {
        "cpu" => Ok(Backend::Cpu),
        "cuda" => cuda_executor(command),
        other => bail!("--backend {other:?}: use cpu, or cuda"),
    }
}

#[cfg(feature = "cuda")]
fn cuda_executor(command: &str) -> anyhow::Result<Backend> {
    require_gpus(&format!("{command} --backend cuda"), &format!("{command} --backend cpu runs the plan on CPU ranks"))?;
    Ok(Backend::Cuda { ordinal: 0 })
}

#[cfg(not(feature = "cuda"))]
fn cuda_executor(command: &str) -> anyhow::Result<Backend> {
    match require_gpus(
        &format!("{command} --backend cuda"),
        &format!("{command} --backend cpu runs the plan on CPU ranks"),
    )? {}
}
