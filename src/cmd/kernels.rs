//! `strata kernels`: the model's CUDA kernels. Compiles every kernel source with NVRTC for
//! a GPU architecture (no GPU needed: CI does this) and lists the files, their entry
//! points and PTX sizes; with `--check`, also runs every kernel on GPU 0 against its CPU
//! reference on fresh random inputs (outputs poisoned with NaN first) and prints each
//! relative error against its bound (fp32 ≤ 1e-5, bf16 ≤ 1e-2). Exit 2 when the build has
//! no CUDA, NVRTC is missing or (with `--check`) there is no GPU; exit 1 when a kernel fails
//! its check.

#[derive(clap::Args, Debug)]
#[command(after_help = "Examples:
  strata kernels                      # compile every kernel for sm_90 and list them
  strata kernels --arch sm_100        # for Blackwell
  strata kernels --check --json       # on a GPU: every kernel against the CPU reference

Needs a build with `--features cuda` and NVRTC 13 on LD_LIBRARY_PATH, e.g.
  pip install nvidia-cuda-nvrtc==13.0.*
  export LD_LIBRARY_PATH=$(python3 -c 'import nvidia; print(list(nvidia.__path__)[0])')/cu13/lib")]
pub struct Args {
    /// GPU architecture to compile for: sm_75, sm_80, sm_86, sm_89, sm_90, sm_100, sm_120.
    #[arg(long, default_value = "sm_90")]
    pub arch: String,
    /// Run every kernel on GPU 0 against its CPU reference (needs a GPU; the architecture is
    /// then the GPU's own).
    #[arg(long)]
    pub check: bool,
    /// Seed of the random inputs of --check (default: from the clock, so each run draws
    /// fresh inputs; the seed is printed).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[cfg(not(feature = "cuda"))]
pub fn run(_args: Args) -> anyhow::Result<()> {
    match super::gpu::require_gpus("strata kernels", "the simulator and the CPU executor need no CUDA")? {}
}

#[cfg(feature = "cuda")]
pub fn run(args: Args) -> anyhow::Result<()> {
    use anyhow::bail;
    use strata_runtime::cuda::{check, kernels};
    let Some(arch) = kernels::ARCHES.iter().find(|a| **a == args.arch) else {
        bail!("--arch {:?}: use one of {}", args.arch, kernels::ARCHES.join(", "));
    };
    kernels::require_nvrtc()?;
    if !args.check {
        let mut rows = Vec::new();
        for s in kernels::SOURCES {
            let t = std::time::Instant::now();
            let ptx = kernels::compile(s, arch)?.to_src();
            rows.push(serde_json::json!({
                "file": s.file, "entries": s.entries, "ptx_bytes": ptx.len(),
                "compile_ms": (t.elapsed().as_secs_f64() * 1e3).round(),
            }));
        }
        if args.json {
            println!("{}", serde_json::to_string_pretty(&serde_json::json!({ "arch": arch, "files": rows }))?);
        } else {
            println!("{} kernel files compiled for {arch} by NVRTC:", rows.len());
            for r in &rows {
                println!(
                    "  {:<16} {:>8} B PTX {:>6} ms   {}",
                    r["file"].as_str().unwrap_or(""),
                    r["ptx_bytes"],
                    r["compile_ms"],
                    r["entries"]
                        .as_array()
                        .map(|e| e.iter().filter_map(|x| x.as_str()).collect::<Vec<_>>().join(" "))
                        .unwrap_or_default()
                );
            }
        }
        return Ok(());
    }
    let gpus = super::gpu::require_gpus(
        "strata kernels --check",
        "without --check, strata kernels compiles the kernels with NVRTC alone",
    )?;
    let (major, minor) = gpus[0].compute_capability;
    let own = format!("sm_{major}{minor}");
    let arch = kernels::ARCHES.iter().find(|a| **a == own).copied().unwrap_or(arch);
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
    });
    let results = check::check_all(0, arch, seed).map_err(|e| crate::common::RunFailure(e.to_string()))?;
    let failed = results.iter().filter(|r| !r.passed).count();
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "gpu": gpus[0].name, "arch": arch, "seed": seed, "checks": results, "failed": failed,
            }))?
        );
    } else {
        println!("{} kernels on {} ({arch}), inputs from seed {seed}:", results.len(), gpus[0].name);
        println!("  {:<32} {:<5} {:<36} {:>10} {:>8}  ok", "kernel", "dtype", "shape", "rel error", "bound");
        for r in &results {
            println!(
                "  {:<32} {:<5} {:<36} {:>10.2e} {:>8.0e}  {}",
                r.kernel,
                r.dtype,
                r.shape,
                r.rel_error,
                r.bound,
                if r.passed { "yes" } else { "NO" }
            );
        }
    }
    if failed > 0 {
        return Err(crate::common::RunFailure(format!(
            "{failed} of {} kernel checks failed (seed {seed})",
            results.len()
        ))
        .into());
    }
    Ok(())
}
