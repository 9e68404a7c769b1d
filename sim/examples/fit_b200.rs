//! Reproduces the B200 profile's fit to published microbenchmarks (sim/data/gpu_microbench.csv):
//! the GEMM grid search and the fused attention kernels' fits where the GPU has fit rows,
//! then every row's published figure, model figure and residual under the built-in profile.
//!
//! `cargo run --release -p strata-sim --example fit_b200`

use strata_models::GpuKind;

fn main() {
    print!("{}", strata_sim::microbench::fit_report(GpuKind::B200));
}
