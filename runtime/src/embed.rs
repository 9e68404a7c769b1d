//! The input embedding on one tensor-parallel rank: vocabulary-parallel word embedding plus
//! learned positions (GPT-2; Megatron-LM's `VocabParallelEmbedding`).
//!
//! Rank r holds rows [r·V/t, (r+1)·V/t) of the word table wte. For token x at row i
//! (position i mod s):
//!
//! ```text
//! out_partial[i] = wte_r[x − r·V/t]   if x is in this rank's rows, else 0
//!                + wpe[i mod s]       on tp rank 0 only
//! ```
//!
//! so Σ over ranks (the caller's all-reduce, or reduce-scatter with sequence parallelism)
//! is wte[x] + wpe[i mod s], each counted once. Backward, from the full gradient dR (T, h):
//! dwte_r[x − r·V/t] += dR[i] for tokens in the shard, and dwpe[i mod s] += dR[i] on every
//! rank, so the replicated position tables stay in sync without communication.
//!
//! A Llama model has no position table (its positions are rotary, applied in the
//! attention): `wpe` is empty and the embedding is wte[x] alone.

use crate::error::RuntimeError;
use crate::micro::Micro;
use crate::params::{EmbedGrads, EmbedParams};
use crate::shard::ShardDims;

/// Checks that every token id is below `vocab`: token ids are user data.
pub fn check_tokens(tokens: &[u32], vocab: usize) -> Result<(), RuntimeError> {
    match tokens.iter().position(|&x| x as usize >= vocab) {
        Some(position) => Err(RuntimeError::TokenOutOfRange { token: tokens[position], position, vocab }),
        None => Ok(()),
    }
}

fn check(d: &ShardDims, mb: Micro, tokens: &[u32], x: &[f32]) {
    assert_eq!(tokens.len(), mb.tokens(), "Embed: {} tokens for a ({}, {}) microbatch", tokens.len(), mb.batch, mb.seq);
    assert_eq!(x.len(), mb.tokens() * d.hidden, "Embed: activations must be (T, h)");
    assert!(mb.seq <= d.max_seq, "Embed: sequence {} longer than the position table's {}", mb.seq, d.max_seq);
    debug_assert!(check_tokens(tokens, d.vocab_total).is_ok(), "tokens must be checked at load time");
}

/// The local row of token `x`, if this rank holds it.
fn local_row(d: &ShardDims, x: u32) -> Option<usize> {
    (x as usize).checked_sub(d.vocab_start).filter(|&row| row < d.vocab)
}

/// `Embed` forward: writes out_partial (T, h) (see the module comment).
pub fn embed_forward(d: &ShardDims, p: &EmbedParams, mb: Micro, tokens: &[u32], out: &mut [f32]) {
    let positions: Vec<u32> = (0..mb.seq as u32).collect();
    embed_forward_at(d, p, mb, &positions, tokens, out);
}

/// `Embed` forward where row i of each sequence sits at position `positions[i]` (context
/// parallelism: a rank's load-balanced chunks, [`crate::attention_cp::cp_positions`]).
pub fn embed_forward_at(d: &ShardDims, p: &EmbedParams, mb: Micro, positions: &[u32], tokens: &[u32], out: &mut [f32]) {
    check(d, mb, tokens, out);
    assert_eq!(positions.len(), mb.seq, "Embed: a position per row of a sequence");
    assert!(positions.iter().all(|&q| (q as usize) < d.max_seq), "Embed: a position past the position table");
    let h = d.hidden;
    for (i, (&x, row)) in tokens.iter().zip(out.chunks_exact_mut(h)).enumerate() {
        match local_row(d, x) {
            Some(v) => row.copy_from_slice(&p.wte[v * h..(v + 1) * h]),
            None => row.fill(0.0),
        }
        if d.tp.rank == 0 && !p.wpe.is_empty() {
            let pos = positions[i % mb.seq] as usize;
            for (o, w) in row.iter_mut().zip(&p.wpe[pos * h..(pos + 1) * h]) {
                *o += w;
            }
        }
    }
}

/// `Embed` backward: accumulates dwte (local rows) and dwpe from the full gradient dr (T, h).
pub fn embed_backward(d: &ShardDims, g: &mut EmbedGrads, mb: Micro, tokens: &[u32], dr: &[f32]) {
    let positions: Vec<u32> = (0..mb.seq as u32).collect();
    embed_backward_at(d, g, mb, &positions, tokens, dr);
}

/// `Embed` backward with the rows' positions (see [`embed_forward_at`]).
pub fn embed_backward_at(d: &ShardDims, g: &mut EmbedGrads, mb: Micro, positions: &[u32], tokens: &[u32], dr: &[f32]) {
    check(d, mb, tokens, dr);
    assert_eq!(positions.len(), mb.seq, "Embed: a position per row of a sequence");
    let h = d.hidden;
    for (i, (&x, row)) in tokens.iter().zip(dr.chunks_exact(h)).enumerate() {
        if let Some(v) = local_row(d, x) {
            for (gw, dv) in g.wte[v * h..(v + 1) * h].iter_mut().zip(row) {
                *gw += dv;
            }
        }
        if g.wpe.is_empty() {
            continue;
        }
        let pos = positions[i % mb.seq] as usize;
        for (gp, dv) in g.wpe[pos * h..(pos + 1) * h].iter_mut().zip(row) {
            *gp += dv;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_range_tokens_are_named() {
        assert!(check_tokens(&[0, 5, 7], 8).is_ok());
        let e = check_tokens(&[0, 8, 9], 8).unwrap_err().to_string();
        assert!(e.contains("token 8 at position 1") && e.contains("8 ids"), "{e}");
    }
}
