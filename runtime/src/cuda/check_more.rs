//! The rest of the kernel checks: embedding, the vocab-parallel loss, the element-wise
//! pieces and the optimizer (see `check.rs` for the method).

use cudarc::driver::{LaunchConfig, PushKernelArg};
use rand::RngExt;

use super::super::reference as r;
use super::{Gpu, Res, Store, blocks, per_cols, per_row};

fn plus(a: &[f64], b: &[f64]) -> Vec<f64> {
    a.iter().zip(b).map(|(x, y)| x + y).collect()
}

pub(super) fn embedding<S: Store>(g: &mut Gpu) -> Res<()> {
    let (seq, hidden, rows, start, tokens) = (128usize, 256usize, 500usize, 250usize, 512usize);
    let tok: Vec<u32> = (0..tokens).map(|_| g.rng.random_range(0..1000u32)).collect();
    let tok_d = g.up_u32(&tok)?;
    let (wte, wtes) = g.fresh::<S>(rows * hidden)?;
    let (wpe, wpes) = g.fresh::<S>(seq * hidden)?;
    let (ti, si, hi, vs, ri) = (tokens as i32, seq as i32, hidden as i32, start as i32, rows as i32);
    let shape = format!("{tokens} tokens, rows {start}..{} of 1000, hidden {hidden}", start + rows);
    let mut out = g.poisoned::<S>(tokens * hidden)?;
    launch!(
        g,
        format!("embed_fwd_{}", S::SUFFIX),
        per_row(tokens),
        &tok_d,
        &wte,
        &wpe,
        &mut out,
        &ti,
        &si,
        &hi,
        &vs,
        &ri
    );
    let e = r::rel_error(&g.down(&out)?, &r::embed_fwd(&tok, &wtes, Some(&wpes), seq, hidden, start, rows));
    g.record(format!("embed_fwd_{}", S::SUFFIX), S::SUFFIX, shape.clone(), &[e], S::BOUND);
    let (dout, douts) = g.fresh::<S>(tokens * hidden)?;
    let (w0, p0) = (g.random(rows * hidden), g.random(seq * hidden));
    let mut dwte = g.up_f32(&w0)?;
    let mut dwpe = g.up_f32(&p0)?;
    let cfg = per_row(tokens);
    launch!(g, format!("embed_bwd_{}", S::SUFFIX), cfg, &tok_d, &dout, &mut dwte, &mut dwpe, &ti, &si, &hi, &vs, &ri);
    let (dw_ref, dp_ref) = r::embed_bwd(&tok, &douts, seq, hidden, start, rows);
    let errs = [r::rel_error(&g.down(&dwte)?, &plus(&w0, &dw_ref)), r::rel_error(&g.down(&dwpe)?, &plus(&p0, &dp_ref))];
    g.record(format!("embed_bwd_{}", S::SUFFIX), S::SUFFIX, shape, &errs, S::ACC_BOUND);
    Ok(())
}

pub(super) fn loss<S: Store>(g: &mut Gpu) -> Res<()> {
    // Two vocabulary shards of one 2,000-id vocabulary, 4 units of logit scale.
    let (rows, cols, tp) = (256usize, 1000usize, 2usize);
    let target: Vec<u32> = (0..rows).map(|_| g.rng.random_range(0..2000u32)).collect();
    let t_d = g.up_u32(&target)?;
    let shards: Vec<Vec<f64>> = (0..tp).map(|_| g.random(rows * cols).iter().map(|v| 4.0 * v).collect()).collect();
    let (ri, ci) = (rows as i32, cols as i32);
    let mut gathered_ref = Vec::new();
    let mut seen = Vec::new();
    for (k, shard) in shards.iter().enumerate() {
        let (x, xs) = g.up::<S>(shard)?;
        let start = (k * cols) as i32;
        let mut st = g.poisoned::<f32>(rows * 3)?;
        launch!(g, format!("xent_stats_{}", S::SUFFIX), per_row(rows), &x, &t_d, &mut st, &ri, &ci, &start);
        let want = r::xent_stats(&xs, &target, cols, k * cols);
        let e = r::rel_error(&g.down(&st)?, &want);
        g.record(
            format!("xent_stats_{} (shard {k})", S::SUFFIX),
            S::SUFFIX,
            format!("{rows}×{cols}"),
            &[e],
            S::ACC_BOUND,
        );
        gathered_ref.extend(want);
        seen.push((x, xs));
    }
    let gathered = g.up_f32(&gathered_ref)?;
    let (lse_ref, loss_ref) = r::xent_combine(&gathered_ref, rows, tp);
    let mut lse = g.poisoned::<f32>(rows)?;
    let mut loss = g.poisoned::<f32>(rows)?;
    let tpi = tp as i32;
    launch!(g, "xent_combine".to_string(), blocks(rows), &gathered, &mut lse, &mut loss, &ri, &tpi);
    let errs = [r::rel_error(&g.down(&lse)?, &lse_ref), r::rel_error(&g.down(&loss)?, &loss_ref)];
    g.record("xent_combine".into(), "f32", format!("{rows} rows, tp {tp}"), &errs, f32::BOUND);
    let lse_in = g.up_f32(&lse_ref)?;
    let scale = 1.0f32 / rows as f32;
    for (k, (mut x, xs)) in seen.into_iter().enumerate() {
        let start = (k * cols) as i32;
        launch!(
            g,
            format!("xent_grad_{}", S::SUFFIX),
            blocks(rows * cols),
            &mut x,
            &t_d,
            &lse_in,
            &ri,
            &ci,
            &start,
            &scale
        );
        let want = r::xent_grad(&xs, &target, &lse_ref, cols, k * cols, scale as f64);
        let e = r::rel_error(&g.down(&x)?, &want);
        g.record(format!("xent_grad_{} (shard {k})", S::SUFFIX), S::SUFFIX, format!("{rows}×{cols}"), &[e], S::BOUND);
    }
    Ok(())
}

pub(super) fn elementwise<S: Store>(g: &mut Gpu) -> Res<()> {
    let (rows, cols) = (300usize, 700usize);
    let n = rows * cols;
    let (mut y, ys) = g.fresh::<S>(n)?;
    let (x, xs) = g.fresh::<S>(n)?;
    let nn = n as i64;
    launch!(g, format!("add_{}", S::SUFFIX), blocks(n), &mut y, &x, &nn);
    let e = r::rel_error(&g.down(&y)?, &plus(&ys, &xs));
    g.record(format!("add_{}", S::SUFFIX), S::SUFFIX, format!("{n}"), &[e], S::BOUND);
    let (mut y, ys) = g.fresh::<S>(n)?;
    let (b, bs) = g.fresh::<S>(cols)?;
    let (rr, ci) = (rows as i64, cols as i32);
    launch!(g, format!("add_bias_{}", S::SUFFIX), blocks(n), &mut y, &b, &rr, &ci);
    let want: Vec<f64> = ys.iter().enumerate().map(|(i, v)| v + bs[i % cols]).collect();
    let e = r::rel_error(&g.down(&y)?, &want);
    g.record(format!("add_bias_{}", S::SUFFIX), S::SUFFIX, format!("{rows}×{cols}"), &[e], S::BOUND);
    let d0 = g.random(cols);
    let mut db = g.up_f32(&d0)?;
    launch!(g, format!("col_sum_{}", S::SUFFIX), per_cols(cols), &x, &mut db, &rr, &ci);
    let want: Vec<f64> = (0..cols).map(|c| d0[c] + (0..rows).map(|r| xs[r * cols + c]).sum::<f64>()).collect();
    let e = r::rel_error(&g.down(&db)?, &want);
    g.record(format!("col_sum_{}", S::SUFFIX), S::SUFFIX, format!("{rows}×{cols}"), &[e], S::ACC_BOUND);
    Ok(())
}

pub(super) fn optimizer(g: &mut Gpu) -> Res<()> {
    let n = 100_003usize;
    let (p, gr) = (g.random(n), g.random(n));
    let m0 = g.random(n).iter().map(|v| v * 0.1).collect::<Vec<f64>>();
    let v0 = g.random(n).iter().map(|v| v * v * 0.01).collect::<Vec<f64>>();
    let h = r::Adam { lr: 1e-3, beta1: 0.9, beta2: 0.95, eps: 1e-8, weight_decay: 0.1, step: 3, grad_scale: 0.5 };
    let (p_ref, m_ref, v_ref) = r::adamw(&h, &p, &gr, &m0, &v0);
    let mut pd = g.up_f32(&p)?;
    let gd = g.up_f32(&gr)?;
    let mut md = g.up_f32(&m0)?;
    let mut vd = g.up_f32(&v0)?;
    let mut copy = g.poisoned::<u16>(n)?;
    let nn = n as i64;
    let (bc1, bc2) = ((1.0 - h.beta1.powi(h.step)) as f32, (1.0 - h.beta2.powi(h.step)) as f32);
    let args = [
        h.lr as f32,
        h.beta1 as f32,
        h.beta2 as f32,
        h.eps as f32,
        h.weight_decay as f32,
        bc1,
        bc2,
        h.grad_scale as f32,
    ];
    launch!(
        g,
        "adamw_step".to_string(),
        blocks(n),
        &mut pd,
        &gd,
        &mut md,
        &mut vd,
        &mut copy,
        &nn,
        &args[0],
        &args[1],
        &args[2],
        &args[3],
        &args[4],
        &args[5],
        &args[6],
        &args[7]
    );
    let errs =
        [r::rel_error(&g.down(&pd)?, &p_ref), r::rel_error(&g.down(&md)?, &m_ref), r::rel_error(&g.down(&vd)?, &v_ref)];
    g.record("adamw_step".into(), "f32", format!("{n}"), &errs, f32::BOUND);
    let e = r::rel_error(&g.down(&copy)?, &p_ref);
    g.record("adamw_step (bf16 copy)".into(), "bf16", format!("{n}"), &[e], u16::BOUND);
    // Σ g² in two passes, then the clipping scale.
    let parts = 120usize;
    let mut partial = g.poisoned_f64(parts)?;
    let cfg = LaunchConfig { grid_dim: (parts as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    launch!(g, "sum_squares_partial".to_string(), cfg, &gd, &nn, &mut partial);
    let mut total = g.poisoned_f64(1)?;
    let one = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    let pi = parts as i32;
    launch!(g, "sum_partials".to_string(), one, &partial, &pi, &mut total);
    let want: f64 = gr.iter().map(|v| (*v as f32 as f64).powi(2)).sum();
    let got = g.stream.clone_dtoh(&total).map_err(|e| super::fail("copying the norm back")(&e))?;
    g.record("sum_squares".into(), "f32", format!("{n}"), &[r::rel_error(&got, &[want])], f32::BOUND);
    let mut sd = g.up_f32(&gr)?;
    let s = 0.25f32;
    launch!(g, "scale_f32".to_string(), blocks(n), &mut sd, &nn, &s);
    let want: Vec<f64> = gr.iter().map(|v| (*v as f32 as f64) * 0.25).collect();
    g.record("scale_f32".into(), "f32", format!("{n}"), &[r::rel_error(&g.down(&sd)?, &want)], f32::BOUND);
    let mut c = g.poisoned::<u16>(n)?;
    launch!(g, "cast_f32_bf16".to_string(), blocks(n), &gd, &mut c, &nn);
    let want: Vec<f64> = gr.iter().map(|v| u16::enc(*v as f32 as f64).dec()).collect();
    g.record("cast_f32_bf16".into(), "bf16", format!("{n}"), &[r::rel_error(&g.down(&c)?, &want)], 0.0);
    let (cb, cbs) = g.up::<u16>(&gr)?;
    let mut acc = g.up_f32(&p)?;
    launch!(g, "accumulate_bf16_f32".to_string(), blocks(n), &cb, &mut acc, &nn);
    let want: Vec<f64> = p.iter().zip(&cbs).map(|(a, b)| (*a as f32 as f64) + b).collect();
    g.record("accumulate_bf16_f32".into(), "f32", format!("{n}"), &[r::rel_error(&g.down(&acc)?, &want)], f32::BOUND);
    Ok(())
}
