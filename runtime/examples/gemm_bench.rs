//! Single-thread GFLOP/s of the runtime's GEMM wrapper on GPT-2-small-shaped products:
//! T = 768 tokens, h = 768, f = 3072 (FC1 forward, and the two transposed products its
//! backward pass runs). Best of several runs, 2·m·k·n FLOPs each.
//!
//! `cargo run --release -p strata-runtime --example gemm_bench`

use std::time::Instant;

use strata_runtime::matmul::{MatMut, MatRef, Transpose, matmul};

fn main() {
    let (t, h, f) = (768usize, 768usize, 3072usize);
    let fill = |n: usize| (0..n).map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5).collect::<Vec<f32>>();
    let (x, w, dy) = (fill(t * h), fill(h * f), fill(t * f));
    let mut y = vec![0.0f32; t * f];
    let mut dx = vec![0.0f32; t * h];
    let mut dw = vec![0.0f32; h * f];
    let flops = 2.0 * (t * h * f) as f64;
    let bench = |name: &str, run: &mut dyn FnMut()| {
        run(); // warm the caches and the page tables
        let best = (0..7)
            .map(|_| {
                let start = Instant::now();
                run();
                start.elapsed().as_secs_f64()
            })
            .fold(f64::INFINITY, f64::min);
        println!("{name:<40} {:>8.2} ms  {:>7.1} GFLOP/s", best * 1e3, flops / best / 1e9);
    };
    bench("y(T,f) = x(T,h)·W(h,f)          [Nn]", &mut || {
        matmul(MatRef::new(&x, t, h), MatRef::new(&w, h, f), MatMut::new(&mut y, t, f), Transpose::Nn, 1.0, 0.0)
    });
    bench("dx(T,h) = dy(T,f)·W(h,f)ᵀ       [Nt]", &mut || {
        matmul(MatRef::new(&dy, t, f), MatRef::new(&w, h, f), MatMut::new(&mut dx, t, h), Transpose::Nt, 1.0, 0.0)
    });
    bench("dW(h,f) += x(T,h)ᵀ·dy(T,f)      [Tn]", &mut || {
        matmul(MatRef::new(&x, t, h), MatRef::new(&dy, t, f), MatMut::new(&mut dw, h, f), Transpose::Tn, 1.0, 1.0)
    });
}
