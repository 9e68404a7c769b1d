//! Training data: a seeded synthetic corpus whose entropy is known exactly, and a
//! byte-level loader for any text file.
//!
//! The synthetic source is a first-order Markov chain over V token ids. Row i of the
//! transition matrix P has `branching` non-zero entries: the successor (i + 1) mod V, which
//! makes the chain irreducible, and `branching − 1` other random states, with peaked
//! random weights ∝ exp(4·u), u ~ U[0, 1). Its entropy rate, in nats per token, is
//!
//! ```text
//! H = − Σ_i π_i Σ_j P_ij · ln P_ij,      π = π·P,  Σ π = 1   (stationary distribution)
//! ```
//!
//! and the chain starts from π, so every target of every window has conditional entropy H
//! given its predecessor: H is the lowest expected cross-entropy any model can reach, and
//! ln V is what a uniform guess costs. With V = 32 and branching 3, H ≈ 0.7–0.9 nats
//! (depending on the seed) ≪ ln 32 ≈ 3.47.
//!
//! Batches cut a token stream into windows of s + 1 tokens (input = first s, target = last
//! s), llm.c-style: sequence n starts at token (n·s) mod (len − s), so any rank can compute
//! any batch from its index alone.

use std::path::{Path, PathBuf};

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use thiserror::Error;

use crate::micro::Micro;

/// Peakedness of the random transition weights: the largest is up to e^4 ≈ 55× the smallest.
const PEAK: f64 = 4.0;

#[derive(Debug, Error)]
pub enum DataError {
    #[error("cannot read the text file {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the text file {path} is empty; give a file with at least {needed} bytes")]
    Empty { path: PathBuf, needed: usize },
    #[error(
        "the corpus {what} has {len} tokens but one sequence of {seq} needs {needed} (seq + 1); use a longer file or a shorter model.seq_len"
    )]
    TooShort { what: String, len: usize, seq: usize, needed: usize },
    #[error("Markov source: {0}")]
    BadSource(String),
    #[error("token {token} at position {position} is not below the corpus vocabulary of {vocab}")]
    TokenOutOfRange { token: u32, position: usize, vocab: usize },
}

/// A first-order Markov source over `vocab` token ids (see the module comment).
#[derive(Clone, Debug)]
pub struct MarkovSource {
    vocab: usize,
    /// Row i: (next token, probability), probabilities summing to 1.
    rows: Vec<Vec<(u32, f64)>>,
    /// The stationary distribution π.
    stationary: Vec<f64>,
}

impl MarkovSource {
    /// A random chain, reproducible from `seed`. Needs 2 ≤ vocab ≤ 65,536 and
    /// 1 ≤ branching ≤ vocab.
    pub fn new(vocab: usize, branching: usize, seed: u64) -> Result<MarkovSource, DataError> {
        if !(2..=1 << 16).contains(&vocab) || branching == 0 || branching > vocab {
            return Err(DataError::BadSource(format!(
                "vocab = {vocab}, branching = {branching}: need 2 ≤ vocab ≤ 65536 and 1 ≤ branching ≤ vocab"
            )));
        }
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let rows: Vec<Vec<(u32, f64)>> = (0..vocab)
            .map(|i| {
                let mut next = vec![((i + 1) % vocab) as u32];
                while next.len() < branching {
                    let j = rng.random_range(0..vocab as u32);
                    if !next.contains(&j) {
                        next.push(j);
                    }
                }
                let w: Vec<f64> = next.iter().map(|_| (PEAK * rng.random::<f64>()).exp()).collect();
                let total: f64 = w.iter().sum();
                next.into_iter().zip(w).map(|(j, w)| (j, w / total)).collect()
            })
            .collect();
        let stationary = stationary_distribution(vocab, &rows);
        Ok(MarkovSource { vocab, rows, stationary })
    }

    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// π, with π·P = π.
    pub fn stationary(&self) -> &[f64] {
        &self.stationary
    }

    /// The entropy rate H in nats per token: the best achievable mean cross-entropy.
    pub fn entropy_rate_nats(&self) -> f64 {
        self.rows
            .iter()
            .zip(&self.stationary)
            .map(|(row, pi)| -pi * row.iter().map(|&(_, p)| p * p.ln()).sum::<f64>())
            .sum()
    }

    /// Mean −ln P(target | input) under the source, in nats, over aligned pairs (a batch's
    /// inputs and targets): the loss of the perfect model on exactly these tokens.
    /// Pairs the source cannot produce cost +∞.
    pub fn cross_entropy_nats(&self, inputs: &[u32], targets: &[u32]) -> f64 {
        assert_eq!(inputs.len(), targets.len(), "inputs and targets must pair up");
        let nll = |x: u32, y: u32| {
            let row = self.rows.get(x as usize).map(Vec::as_slice).unwrap_or(&[]);
            row.iter().find(|&&(j, _)| j == y).map_or(f64::INFINITY, |&(_, p)| -p.ln())
        };
        inputs.iter().zip(targets).map(|(&x, &y)| nll(x, y)).sum::<f64>() / inputs.len().max(1) as f64
    }

    /// `len` tokens of the chain, the first drawn from π, reproducible from `seed`.
    pub fn sample(&self, len: usize, seed: u64) -> Vec<u32> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let pick = |rng: &mut ChaCha8Rng, items: &mut dyn Iterator<Item = (u32, f64)>| {
            let u = rng.random::<f64>();
            let mut acc = 0.0;
            let mut last = 0;
            for (j, p) in items {
                acc += p;
                last = j;
                if u < acc {
                    return j;
                }
            }
            last // u fell in the rounding gap below 1.0
        };
        let mut out = Vec::with_capacity(len);
        if len == 0 {
            return out;
        }
        let mut state = pick(&mut rng, &mut self.stationary.iter().enumerate().map(|(j, &p)| (j as u32, p)));
        out.push(state);
        while out.len() < len {
            state = pick(&mut rng, &mut self.rows[state as usize].iter().copied());
            out.push(state);
        }
        out
    }

    /// A corpus of `len` sampled tokens.
    pub fn corpus(&self, len: usize, seed: u64) -> Corpus {
        Corpus {
            tokens: self.sample(len, seed),
            vocab: self.vocab,
            name: format!("markov(V={}, seed={seed})", self.vocab),
        }
    }
}

/// Chains up to this many states get π by an exact dense solve ([`stationary_dense`]: v² f64
/// and v³ operations, 8 MiB and about a second here); larger ones, a GPT-2 vocabulary of
/// 50,257 say, by power iteration on the sparse chain ([`stationary_sparse`]), where a dense
/// solve would need 20 GB and hours.
const DENSE_STATES: usize = 1024;

/// π, with π·P = π and Σπ = 1: exact for small chains, iterated for large ones.
fn stationary_distribution(v: usize, rows: &[Vec<(u32, f64)>]) -> Vec<f64> {
    if v <= DENSE_STATES { stationary_dense(v, rows) } else { stationary_sparse(v, rows) }
}

/// Most sweeps [`stationary_sparse`] makes (each O(v · branching)); it stops well before on
/// the chains [`MarkovSource::new`] builds (185 to 403 sweeps for 1,024 to 65,536 states
/// over a few seeds).
const MAX_SWEEPS: usize = 20_000;

/// π by power iteration on the lazy chain (P + I)/2, which has the same π and, being
/// aperiodic, converges to it from the uniform start; stops once a sweep moves π by under
/// 1e-14 in L1. The chain's cycle i → i + 1 makes it irreducible, so π is unique.
fn stationary_sparse(v: usize, rows: &[Vec<(u32, f64)>]) -> Vec<f64> {
    let mut pi = vec![1.0 / v as f64; v];
    let mut next = vec![0.0f64; v];
    for _ in 0..MAX_SWEEPS {
        next.iter_mut().zip(&pi).for_each(|(n, &p)| *n = 0.5 * p);
        for (i, row) in rows.iter().enumerate() {
            let half = 0.5 * pi[i];
            for &(j, p) in row {
                next[j as usize] += half * p;
            }
        }
        let total: f64 = next.iter().sum();
        let moved: f64 = next.iter().zip(&pi).map(|(n, p)| (n / total - p).abs()).sum();
        pi.iter_mut().zip(&next).for_each(|(p, &n)| *p = n / total);
        if moved < 1e-14 {
            break;
        }
    }
    pi
}

/// Solves π·(P − I) = 0 with Σπ = 1 by Gaussian elimination with partial pivoting (f64).
/// The chain is irreducible, so the solution is unique.
fn stationary_dense(v: usize, rows: &[Vec<(u32, f64)>]) -> Vec<f64> {
    // Unknowns π_j; equation j: Σ_i π_i P_ij − π_j = 0; the last equation becomes Σ π = 1.
    let mut a = vec![0.0f64; v * (v + 1)];
    for (i, row) in rows.iter().enumerate() {
        for &(j, p) in row {
            a[j as usize * (v + 1) + i] += p;
        }
        a[i * (v + 1) + i] -= 1.0;
    }
    for i in 0..v {
        a[(v - 1) * (v + 1) + i] = 1.0;
    }
    a[(v - 1) * (v + 1) + v] = 1.0;
    for col in 0..v {
        let pivot =
            (col..v).max_by(|&x, &y| a[x * (v + 1) + col].abs().total_cmp(&a[y * (v + 1) + col].abs())).unwrap_or(col);
        for k in 0..=v {
            a.swap(col * (v + 1) + k, pivot * (v + 1) + k);
        }
        let diag = a[col * (v + 1) + col];
        for r in 0..v {
            if r != col {
                let f = a[r * (v + 1) + col] / diag;
                if f != 0.0 {
                    for k in col..=v {
                        a[r * (v + 1) + k] -= f * a[col * (v + 1) + k];
                    }
                }
            }
        }
    }
    (0..v).map(|i| a[i * (v + 1) + v] / a[i * (v + 1) + i]).collect()
}

/// A stream of token ids below `vocab`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Corpus {
    tokens: Vec<u32>,
    vocab: usize,
    /// Where it came from, for messages.
    name: String,
}

/// One microbatch: `micro.batch` sequences of `micro.seq` tokens, flattened row-major.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Batch {
    pub micro: Micro,
    pub inputs: Vec<u32>,  // (b*s)
    pub targets: Vec<u32>, // (b*s) the input shifted by one token
}

impl Corpus {
    /// Wraps `tokens`, checking each is below `vocab`.
    pub fn new(tokens: Vec<u32>, vocab: usize, name: &str) -> Result<Corpus, DataError> {
        if let Some(position) = tokens.iter().position(|&x| x as usize >= vocab) {
            return Err(DataError::TokenOutOfRange { token: tokens[position], position, vocab });
        }
        Ok(Corpus { tokens, vocab, name: name.to_string() })
    }

    /// Every byte of a file is a token (vocabulary 256). The file must hold at least
    /// `seq + 1` bytes, one training window.
    pub fn from_text_file(path: &Path, seq: usize) -> Result<Corpus, DataError> {
        let bytes = std::fs::read(path).map_err(|source| DataError::Io { path: path.to_path_buf(), source })?;
        if bytes.is_empty() {
            return Err(DataError::Empty { path: path.to_path_buf(), needed: seq + 1 });
        }
        let corpus =
            Corpus { tokens: bytes.into_iter().map(u32::from).collect(), vocab: 256, name: path.display().to_string() };
        corpus.check_len(seq)?;
        Ok(corpus)
    }

    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    pub fn vocab(&self) -> usize {
        self.vocab
    }

    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    fn check_len(&self, seq: usize) -> Result<(), DataError> {
        if self.tokens.len() < seq + 1 {
            return Err(DataError::TooShort { what: self.name.clone(), len: self.tokens.len(), seq, needed: seq + 1 });
        }
        Ok(())
    }

    /// Microbatch number `index`: sequences index·b … index·b + b − 1 of the stream (see the
    /// module comment). A data-parallel run can use index = (step·dp + replica)·m + k for
    /// microbatch k of m, so that every replica reads different windows.
    pub fn batch(&self, index: u64, micro: Micro) -> Result<Batch, DataError> {
        self.check_len(micro.seq)?;
        let s = micro.seq;
        let starts = (self.tokens.len() - s) as u64;
        let mut inputs = Vec::with_capacity(micro.tokens());
        let mut targets = Vec::with_capacity(micro.tokens());
        for j in 0..micro.batch as u64 {
            let n = index.wrapping_mul(micro.batch as u64).wrapping_add(j);
            let start = (n.wrapping_mul(s as u64) % starts) as usize;
            inputs.extend_from_slice(&self.tokens[start..start + s]);
            targets.extend_from_slice(&self.tokens[start + 1..start + s + 1]);
        }
        Ok(Batch { micro, inputs, targets })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stationary_distribution_is_stationary_and_entropy_is_below_ln_v() {
        let src = MarkovSource::new(32, 3, 5).unwrap();
        let pi = src.stationary();
        assert!((pi.iter().sum::<f64>() - 1.0).abs() < 1e-12 && pi.iter().all(|&p| p > 0.0));
        let mut next = vec![0.0; 32];
        for (i, row) in src.rows.iter().enumerate() {
            for &(j, p) in row {
                next[j as usize] += pi[i] * p;
            }
        }
        for j in 0..32 {
            assert!((next[j] - pi[j]).abs() < 1e-12, "π·P ≠ π at {j}");
        }
        let h = src.entropy_rate_nats();
        assert!(h > 0.1 && h < 3.0f64.ln() && h < 0.5 * 32f64.ln(), "H = {h}");
    }

    /// π·P − π in L∞, relative to the largest π.
    fn stationarity_error(src: &MarkovSource) -> f64 {
        let pi = src.stationary();
        let mut next = vec![0.0; pi.len()];
        for (i, row) in src.rows.iter().enumerate() {
            for &(j, p) in row {
                next[j as usize] += pi[i] * p;
            }
        }
        let top = pi.iter().copied().fold(0.0, f64::max);
        next.iter().zip(pi).map(|(n, p)| (n - p).abs()).fold(0.0, f64::max) / top
    }

    #[test]
    fn the_sparse_iteration_agrees_with_the_exact_solve_and_scales_to_a_gpt2_vocabulary() {
        // Both ways on a chain small enough to solve exactly.
        let src = MarkovSource::new(DENSE_STATES, 3, 4).unwrap();
        let sparse = stationary_sparse(DENSE_STATES, &src.rows);
        let worst = src.stationary().iter().zip(&sparse).map(|(a, b)| (a - b).abs() / a).fold(0.0, f64::max);
        assert!(worst < 1e-9, "dense and sparse π differ by {worst:e} (relative)");
        // GPT-2's vocabulary (a dense solve would need 20 GB): stationary, summing to 1.
        let big = MarkovSource::new(50_257, 3, 0).unwrap();
        assert!((big.stationary().iter().sum::<f64>() - 1.0).abs() < 1e-12);
        assert!(big.stationary().iter().all(|&p| p > 0.0));
        let err = stationarity_error(&big);
        assert!(err < 1e-9, "π·P − π = {err:e} of the largest π");
        let h = big.entropy_rate_nats();
        assert!(h > 0.1 && h < 3.0f64.ln(), "H = {h}");
    }

    #[test]
    fn empirical_conditional_entropy_matches_the_entropy_rate() {
        // The plug-in estimate −(1/N) Σ ln P(x_{t+1} | x_t) over a sample converges to H;
        // its standard deviation is ≈ σ/√N with σ ≲ 1.5 nats, so ≈ 0.005 for N = 10⁵.
        let src = MarkovSource::new(32, 3, 6).unwrap();
        let x = src.sample(100_000, 7);
        let nll = src.cross_entropy_nats(&x[..x.len() - 1], &x[1..]);
        let h = src.entropy_rate_nats();
        assert!((nll - h).abs() < 0.03, "sample cross-entropy {nll} vs entropy rate {h}");
    }

    #[test]
    fn sources_and_samples_are_reproducible() {
        let a = MarkovSource::new(16, 2, 1).unwrap().sample(500, 2);
        assert_eq!(a, MarkovSource::new(16, 2, 1).unwrap().sample(500, 2));
        assert_ne!(a, MarkovSource::new(16, 2, 1).unwrap().sample(500, 3));
        assert_ne!(a, MarkovSource::new(16, 2, 9).unwrap().sample(500, 2));
        assert!(MarkovSource::new(16, 17, 1).is_err() && MarkovSource::new(1, 1, 1).is_err());
    }

    #[test]
    fn batches_are_shifted_windows() {
        let corpus = Corpus::new((0..100).collect(), 100, "counting").unwrap();
        let b = corpus.batch(3, Micro { batch: 2, seq: 5 }).unwrap();
        // Sequences 6 and 7 start at tokens 30 and 35.
        assert_eq!(b.inputs, vec![30, 31, 32, 33, 34, 35, 36, 37, 38, 39]);
        assert_eq!(b.targets, vec![31, 32, 33, 34, 35, 36, 37, 38, 39, 40]);
        // Far indices wrap around inside the stream.
        let far = corpus.batch(1_000_000, Micro { batch: 2, seq: 5 }).unwrap();
        assert!(far.targets.iter().all(|&t| t < 100));
        assert!(Corpus::new(vec![1, 2, 300], 256, "x").is_err());
    }

    #[test]
    fn text_files_load_as_bytes_and_short_files_are_named() {
        let dir = std::env::temp_dir().join(format!("strata-runtime-data-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (ok, empty, short) = (dir.join("ok.txt"), dir.join("empty.txt"), dir.join("short.txt"));
        std::fs::write(&ok, "hello, world").unwrap();
        std::fs::write(&empty, "").unwrap();
        std::fs::write(&short, "hi").unwrap();
        let c = Corpus::from_text_file(&ok, 4).unwrap();
        assert_eq!((c.vocab(), c.len(), c.tokens()[0]), (256, 12, b'h' as u32));
        let e = Corpus::from_text_file(&empty, 4).unwrap_err().to_string();
        assert!(e.contains("empty.txt") && e.contains("is empty"), "{e}");
        let e = Corpus::from_text_file(&short, 4).unwrap_err().to_string();
        assert!(e.contains("short.txt") && e.contains("2 tokens") && e.contains("needs 5"), "{e}");
        let e = Corpus::from_text_file(&dir.join("missing.txt"), 4).unwrap_err().to_string();
        assert!(e.contains("missing.txt") && e.contains("cannot read"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
