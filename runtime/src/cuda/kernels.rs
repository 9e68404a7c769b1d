//! The model's CUDA kernels as source, compiled at run time by NVRTC: what each file holds,
//! the entry points it must define, and compilation to PTX for a GPU architecture.
//!
//! The sources (`kernels/*.cu`) need no CUDA header — bf16 is converted by hand in
//! `common.cuh`, which is prepended to each file — so NVRTC alone compiles them, also on a
//! machine without a GPU (CI compiles every file to `sm_90` PTX). Each templated kernel is
//! instantiated for fp32 and bf16 storage, as `NAME_f32` and `NAME_bf16`; arithmetic is fp32.

use cudarc::nvrtc::{CompileOptions, Ptx, compile_ptx_with_opts};

use super::CudaError;

/// Prepended to every source file.
pub const COMMON: &str = include_str!("kernels/common.cuh");

/// One source file and the entry points it defines.
#[derive(Clone, Copy, Debug)]
pub struct Source {
    pub file: &'static str,
    pub text: &'static str,
    pub entries: &'static [&'static str],
}

macro_rules! both {
    ($($name:literal),* $(,)?) => { &[$(concat!($name, "_f32"), concat!($name, "_bf16")),*] };
}

/// Every kernel file of the model.
pub const SOURCES: &[Source] = &[
    Source { file: "embed.cu", text: include_str!("kernels/embed.cu"), entries: both!("embed_fwd", "embed_bwd") },
    Source {
        file: "norm.cu",
        text: include_str!("kernels/norm.cu"),
        entries: both!(
            "layernorm_fwd",
            "rmsnorm_fwd",
            "layernorm_bwd_dx",
            "rmsnorm_bwd_dx",
            "layernorm_bwd_params",
            "rmsnorm_bwd_params"
        ),
    },
    Source {
        file: "act.cu",
        text: include_str!("kernels/act.cu"),
        entries: both!("gelu_fwd", "gelu_bwd", "swiglu_fwd", "swiglu_bwd"),
    },
    Source { file: "rope.cu", text: include_str!("kernels/rope.cu"), entries: both!("rope") },
    Source {
        file: "attention.cu",
        text: include_str!("kernels/attention.cu"),
        entries: both!("attn_fwd", "attn_bwd_delta", "attn_bwd_dq", "attn_bwd_dkdv"),
    },
    Source { file: "attention_tc.cu", text: include_str!("kernels/attention_tc.cu"), entries: ATTN_TC_ENTRIES },
    Source { file: "loss.cu", text: include_str!("kernels/loss.cu"), entries: LOSS_ENTRIES },
    Source { file: "optim.cu", text: include_str!("kernels/optim.cu"), entries: OPTIM_ENTRIES },
    Source {
        file: "elementwise.cu",
        text: include_str!("kernels/elementwise.cu"),
        entries: both!("add", "add_bias", "col_sum"),
    },
];

const ATTN_TC_ENTRIES: &[&str] = &[
    "attn_fwd_tc64_bf16",
    "attn_bwd_dq_tc64_bf16",
    "attn_bwd_dkdv_tc64_bf16",
    "attn_fwd_tc128_bf16",
    "attn_bwd_dq_tc128_bf16",
    "attn_bwd_dkdv_tc128_bf16",
];

/// The causal attention kernels that run one head size in bf16, and their launch shape.
/// Head sizes 64 and 128 run on the tensor cores (`attention_tc.cu`: mma.sync, 16 rows per
/// warp, 64 per block of 128 threads); every other head size — and any when the environment
/// sets `STRATA_ATTENTION=scalar` — runs `attention.cu`'s scalar kernels (one warp per row,
/// 8 rows per block of 256 threads). The delta kernel is `attention.cu`'s either way. Both
/// families take the same arguments in the same order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttnKernels {
    pub fwd: &'static str,
    pub delta: &'static str,
    pub dq: &'static str,
    pub dkdv: &'static str,
    /// The file that defines `fwd`, `dq` and `dkdv`.
    pub file: &'static str,
    /// Rows (queries, or keys for dk/dv) per block, and threads per block.
    pub block_rows: u32,
    pub threads: u32,
}

const ATTN_SCALAR: AttnKernels = AttnKernels {
    fwd: "attn_fwd_bf16",
    delta: "attn_bwd_delta_bf16",
    dq: "attn_bwd_dq_bf16",
    dkdv: "attn_bwd_dkdv_bf16",
    file: "attention.cu",
    block_rows: 8,
    threads: 256,
};

/// What the delta kernel's launch always is (`attention.cu`'s blocks of 8 rows).
pub const ATTN_DELTA: AttnKernels = ATTN_SCALAR;

/// The kernels for head size `head_dim` (see [`AttnKernels`]).
pub fn attn_kernels(head_dim: usize) -> AttnKernels {
    static SCALAR: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let scalar = *SCALAR.get_or_init(|| std::env::var("STRATA_ATTENTION").is_ok_and(|v| v == "scalar"));
    let tc = |fwd, dq, dkdv| AttnKernels {
        fwd,
        delta: ATTN_SCALAR.delta,
        dq,
        dkdv,
        file: "attention_tc.cu",
        block_rows: 64,
        threads: 128,
    };
    match head_dim {
        64 if !scalar => tc("attn_fwd_tc64_bf16", "attn_bwd_dq_tc64_bf16", "attn_bwd_dkdv_tc64_bf16"),
        128 if !scalar => tc("attn_fwd_tc128_bf16", "attn_bwd_dq_tc128_bf16", "attn_bwd_dkdv_tc128_bf16"),
        _ => ATTN_SCALAR,
    }
}

impl AttnKernels {
    /// The grid over `seq` rows of `heads` heads (query heads, or kv heads for dk/dv) and
    /// `batch` sequences.
    pub fn grid(&self, seq: usize, heads: usize, batch: usize) -> cudarc::driver::LaunchConfig {
        cudarc::driver::LaunchConfig {
            grid_dim: (seq.div_ceil(self.block_rows as usize) as u32, heads as u32, batch as u32),
            block_dim: (self.threads, 1, 1),
            shared_mem_bytes: 0,
        }
    }
}

const LOSS_ENTRIES: &[&str] = &["xent_stats_f32", "xent_stats_bf16", "xent_grad_f32", "xent_grad_bf16", "xent_combine"];
const OPTIM_ENTRIES: &[&str] =
    &["adamw_step", "sum_squares_partial", "sum_partials", "scale_f32", "cast_f32_bf16", "accumulate_bf16_f32"];

/// The architecture the executor targets by default (Hopper).
pub const DEFAULT_ARCH: &str = "sm_90";

/// Architectures `strata kernels --arch` accepts (NVRTC 13: Volta is gone).
pub const ARCHES: &[&str] = &["sm_75", "sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_120"];

/// The file's full text as NVRTC sees it.
pub fn full_source(s: &Source) -> String {
    format!("{COMMON}\n// ---- {} ----\n{}", s.file, s.text)
}

/// Whether the NVRTC library can be loaded (cudarc would panic on a missing one).
pub fn nvrtc_present() -> bool {
    // SAFETY: only tries to open the shared library by its candidate names.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// An error unless NVRTC can be loaded, saying where it comes from.
pub fn require_nvrtc() -> Result<(), CudaError> {
    if nvrtc_present() {
        Ok(())
    } else {
        Err(CudaError {
            what: "loading NVRTC, the CUDA runtime compiler".into(),
            cause: "no libnvrtc.so.13 on this machine: install the CUDA 13 toolkit or `pip install \
                    nvidia-cuda-nvrtc==13.0.*` and put its `nvidia/cu13/lib` directory on LD_LIBRARY_PATH"
                .into(),
        })
    }
}

/// Compiles one file to PTX for `arch` (e.g. `sm_90`).
pub fn compile(s: &Source, arch: &'static str) -> Result<Ptx, CudaError> {
    require_nvrtc()?;
    let opts = CompileOptions {
        arch: Some(arch),
        // IEEE division and square root, no flush-to-zero: the bounds against the CPU
        // reference are tight for fp32.
        prec_div: Some(true),
        prec_sqrt: Some(true),
        ftz: Some(false),
        options: vec!["--std=c++17".into()],
        name: Some(s.file.to_string()),
        ..Default::default()
    };
    compile_ptx_with_opts(full_source(s), opts)
        .map_err(|e| CudaError { what: format!("compiling {} for {arch} with NVRTC", s.file), cause: format!("{e:?}") })
}

/// The `.entry` names a PTX text defines, in order.
pub fn ptx_entries(ptx: &str) -> Vec<String> {
    ptx.lines()
        .filter_map(|l| {
            let rest =
                l.trim_start().strip_prefix(".visible .entry ").or_else(|| l.trim_start().strip_prefix(".entry "))?;
            Some(rest.split(|c: char| c == '(' || c.is_whitespace()).next().unwrap_or("").to_string())
        })
        .collect()
}

/// A compiled file: its PTX and the entries it defines.
pub struct Compiled {
    pub source: Source,
    pub ptx: Ptx,
    pub entries: Vec<String>,
}

/// Compiles every file for `arch` and checks that each defines exactly its entries.
pub fn compile_all(arch: &'static str) -> Result<Vec<Compiled>, CudaError> {
    SOURCES
        .iter()
        .map(|s| {
            let ptx = compile(s, arch)?;
            let mut entries = ptx_entries(&ptx.to_src());
            entries.sort();
            let mut want: Vec<String> = s.entries.iter().map(|e| e.to_string()).collect();
            want.sort();
            if entries != want {
                return Err(CudaError {
                    what: format!("checking the entry points of {}", s.file),
                    cause: format!("the PTX defines {entries:?}, the registry lists {want:?}"),
                });
            }
            Ok(Compiled { source: *s, ptx, entries })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// CI installs NVRTC 13.0 and sets `STRATA_REQUIRE_NVRTC=1`, so there a missing library
    /// fails the test; elsewhere it is skipped with a note.
    fn nvrtc_or_skip() -> bool {
        if nvrtc_present() {
            return true;
        }
        assert!(
            std::env::var_os("STRATA_REQUIRE_NVRTC").is_none(),
            "STRATA_REQUIRE_NVRTC is set but NVRTC cannot be loaded: {}",
            require_nvrtc().unwrap_err()
        );
        eprintln!("NVRTC is not installed: kernel compilation not tested here");
        false
    }

    #[test]
    fn every_kernel_compiles_to_sm90_ptx_with_its_entries() {
        if !nvrtc_or_skip() {
            return;
        }
        let compiled = compile_all(DEFAULT_ARCH).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(compiled.len(), SOURCES.len());
        for c in &compiled {
            let ptx = c.ptx.to_src();
            assert!(ptx.contains(".target sm_90"), "{}: {}", c.source.file, &ptx[..ptx.len().min(400)]);
            assert!(!c.entries.is_empty());
        }
        let total: usize = compiled.iter().map(|c| c.entries.len()).sum();
        assert!(total >= 45, "{total} entries");
    }

    #[test]
    fn a_broken_source_is_an_error_with_the_compiler_log() {
        if !nvrtc_or_skip() {
            return;
        }
        let bad =
            Source { file: "bad.cu", text: "extern \"C\" __global__ void f() { undeclared(); }", entries: &["f"] };
        let Err(e) = compile(&bad, DEFAULT_ARCH) else { panic!("a broken source must not compile") };
        let e = e.to_string();
        assert!(e.contains("bad.cu") && e.contains("undeclared"), "{e}");
    }

    #[test]
    fn entry_names_are_read_from_ptx() {
        let ptx =
            ".version 9.0\n.target sm_90\n.visible .entry add_f32(\n\t.param .u64 a\n)\n.visible .entry scale_f32(\n";
        assert_eq!(ptx_entries(ptx), vec!["add_f32", "scale_f32"]);
    }
}

/// A kernel parameter's kind, as a launch passes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Param {
    /// A device pointer.
    Ptr,
    /// `int` or `unsigned int`.
    I32,
    /// `long long`.
    I64,
    /// `float`.
    F32,
}

/// Every entry point's parameter list, read from the sources (the `extern "C"` signatures,
/// `NAME_##SUF` instantiated as `NAME_f32` and `NAME_bf16`), so that a launch can be checked
/// against the kernel before it reaches the GPU.
pub fn signatures() -> Result<std::collections::BTreeMap<String, Vec<Param>>, String> {
    let mut out = std::collections::BTreeMap::new();
    for s in SOURCES {
        let text = s.text.replace("\\\n", " ");
        let mut rest = text.as_str();
        while let Some(i) = rest.find("extern \"C\"") {
            rest = &rest[i + 10..];
            let v = rest.find("void").ok_or_else(|| format!("{}: an extern \"C\" without void", s.file))?;
            let mut sig = rest[v + 4..].trim_start();
            if let Some(b) = sig.strip_prefix("__launch_bounds__") {
                let close = b.find(')').ok_or_else(|| format!("{}: unclosed __launch_bounds__", s.file))?;
                sig = b[close + 1..].trim_start();
            }
            let open = sig.find('(').ok_or_else(|| format!("{}: a kernel without parameters", s.file))?;
            let close = sig.find(')').ok_or_else(|| format!("{}: unclosed parameter list", s.file))?;
            let name = sig[..open].trim();
            let params = sig[open + 1..close]
                .split(',')
                .map(|p| {
                    let p = p.split_whitespace().collect::<Vec<_>>().join(" ");
                    if p.contains('*') {
                        return Ok(Param::Ptr);
                    }
                    let ty = p.rsplit_once(' ').map_or("", |(t, _)| t);
                    match ty {
                        "int" | "unsigned int" => Ok(Param::I32),
                        "long long" => Ok(Param::I64),
                        "float" => Ok(Param::F32),
                        _ => Err(format!("{}: kernel {name}: parameter \"{p}\" of an unknown type", s.file)),
                    }
                })
                .collect::<Result<Vec<_>, _>>()?;
            match name.strip_suffix("##SUF") {
                Some(base) => {
                    out.insert(format!("{base}f32"), params.clone());
                    out.insert(format!("{base}bf16"), params);
                }
                // A head-size macro's entry (`NAME##D##_bf16`): one per `MACRO(D)` line.
                None if name.contains("##D##") => {
                    for d in size_instances(&text) {
                        out.insert(name.replace("##D##", &d), params.clone());
                    }
                }
                None => {
                    out.insert(name.to_string(), params);
                }
            }
            rest = &rest[close.min(rest.len())..];
        }
    }
    Ok(out)
}

/// The sizes a file instantiates its `#define MACRO(D)` with: the `MACRO(64)` lines.
fn size_instances(text: &str) -> Vec<String> {
    let macros: Vec<&str> =
        text.lines().filter_map(|l| l.strip_prefix("#define ")?.split_once("(D)").map(|(m, _)| m.trim())).collect();
    text.lines()
        .filter_map(|l| {
            let (m, rest) = l.trim().split_once('(')?;
            let d = rest.strip_suffix(')')?;
            (macros.contains(&m) && !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit())).then(|| d.to_string())
        })
        .collect()
}

#[cfg(test)]
mod signature_tests {
    use super::*;

    #[test]
    fn every_entry_point_has_a_signature_read_from_its_source() {
        let sigs = signatures().unwrap();
        for s in SOURCES {
            for e in s.entries {
                assert!(sigs.contains_key(*e), "{}: no signature for {e}; read {:?}", s.file, sigs.keys());
            }
        }
        use Param::*;
        assert_eq!(sigs["attn_fwd_bf16"], [Ptr, Ptr, Ptr, Ptr, Ptr, I32, I32, I32, I32, I32, I64, I64, I64, F32]);
        // The tensor-core kernels take the scalar ones' arguments: the executor swaps names.
        for (tc, plain) in
            [("attn_fwd_tc", "attn_fwd"), ("attn_bwd_dq_tc", "attn_bwd_dq"), ("attn_bwd_dkdv_tc", "attn_bwd_dkdv")]
        {
            for d in [64, 128] {
                assert_eq!(sigs[&format!("{tc}{d}_bf16")], sigs[&format!("{plain}_bf16")], "{tc}{d}");
            }
        }
        assert_eq!(sigs["add_bias_f32"], [Ptr, Ptr, I64, I32]);
        assert_eq!(sigs["xent_combine"], [Ptr, Ptr, Ptr, I32, I32]);
        assert_eq!(sigs["adamw_step"], [[Ptr; 5].as_slice(), &[I64], &[F32; 8]].concat());
        assert_eq!(sigs["embed_fwd_bf16"], [Ptr, Ptr, Ptr, Ptr, I32, I32, I32, I32, I32]);
    }
}
