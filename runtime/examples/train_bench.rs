//! Training speed of a GPT-2-small-shaped model on 1 and 2 CPU ranks against the GEMM
//! kernel's own rate on the same shapes (what `cargo xtask bench` prints).
//!
//! `cargo run --release -p strata-runtime --example train_bench`

fn main() {
    let cfg = strata_runtime::bench::BenchConfig::default();
    println!(
        "GPT-2-small-shaped: {} layers, hidden {}, {} heads, seq {}, global batch {} sequences",
        cfg.layers, cfg.hidden, cfg.heads, cfg.seq, cfg.global_batch
    );
    println!(
        "{:<14} {:>5} {:>8} {:>10} {:>14} {:>12} {:>11}",
        "split", "ranks", "step s", "tokens/s", "achieved GF/s", "GEMM GF/s", "efficiency"
    );
    let out = strata_runtime::bench::run(&cfg, |r| {
        println!(
            "{:<14} {:>5} {:>8.2} {:>10.0} {:>14.1} {:>12.1} {:>10.0}%",
            r.split,
            r.ranks,
            r.step_s,
            r.tokens_per_s,
            r.achieved_gflops,
            r.gemm_gflops,
            100.0 * r.efficiency
        )
    });
    if let Err(e) = out {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
