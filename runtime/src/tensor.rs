//! A minimal f32 tensor: one contiguous row-major buffer and its shape.
//!
//! There is no autograd and no broadcasting. Kernels take plain slices plus the sizes they
//! need; `Tensor` exists so that saved activations carry their shape (for assertions and
//! for the executor's per-buffer byte accounting) and so that buffers can be reused across
//! microbatches without reallocating. Element (i, j) of a (rows, cols) tensor is
//! `data[i * cols + j]`. One element is 4 bytes.

use std::ops::{Deref, DerefMut};

/// Bytes in one f32 element.
pub const F32_BYTES: usize = 4;

/// An owned, row-major f32 buffer with a shape. Derefs to its elements.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Tensor {
    data: Vec<f32>,
    shape: Vec<usize>,
}

impl Tensor {
    /// A tensor of zeros.
    pub fn zeros(shape: &[usize]) -> Tensor {
        Tensor { data: vec![0.0; shape.iter().product()], shape: shape.to_vec() }
    }

    /// A tensor owning `data`, which must hold exactly the product of `shape` elements.
    pub fn from_vec(data: Vec<f32>, shape: &[usize]) -> Tensor {
        let n: usize = shape.iter().product();
        assert_eq!(data.len(), n, "a tensor of shape {shape:?} needs {n} elements");
        Tensor { data, shape: shape.to_vec() }
    }

    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Bytes the elements occupy (the allocation may be larger; see [`Tensor::capacity_bytes`]).
    pub fn bytes(&self) -> usize {
        self.data.len() * F32_BYTES
    }

    /// Bytes the allocation really holds: what a memory profile of the process would see.
    pub fn capacity_bytes(&self) -> usize {
        self.data.capacity() * F32_BYTES
    }

    /// Makes this tensor `shape`, all zeros, reusing the allocation when it is big enough.
    pub fn reset(&mut self, shape: &[usize]) {
        self.data.clear();
        self.data.resize(shape.iter().product(), 0.0);
        self.shape.clear();
        self.shape.extend_from_slice(shape);
    }

    /// Makes this tensor a copy of `src` with shape `shape`, reusing the allocation.
    pub fn assign(&mut self, src: &[f32], shape: &[usize]) {
        let n: usize = shape.iter().product();
        assert_eq!(src.len(), n, "a tensor of shape {shape:?} needs {n} elements");
        self.data.clear();
        self.data.extend_from_slice(src);
        self.shape.clear();
        self.shape.extend_from_slice(shape);
    }

    /// Keeps only rows `rows` (along the first dimension) and frees the rest: how a
    /// sequence-parallel rank keeps its slice of a gathered activation.
    pub fn keep_rows(&mut self, rows: std::ops::Range<usize>) {
        let n = self.shape.first().copied().unwrap_or(0);
        assert!(rows.start <= rows.end && rows.end <= n, "rows {rows:?} of a tensor with {n}");
        let width = self.data.len() / n.max(1);
        self.data.truncate(rows.end * width);
        self.data.drain(..rows.start * width);
        self.data.shrink_to_fit();
        self.shape[0] = rows.len();
    }

    /// Releases the memory: the tensor becomes empty with shape [0].
    pub fn release(&mut self) {
        self.data = Vec::new();
        self.shape = vec![0];
    }

    pub fn into_vec(self) -> Vec<f32> {
        self.data
    }
}

impl Deref for Tensor {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        &self.data
    }
}

impl DerefMut for Tensor {
    fn deref_mut(&mut self) -> &mut [f32] {
        &mut self.data
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reset_reuses_and_zeroes_and_release_frees() {
        let mut t = Tensor::from_vec(vec![1.0; 6], &[2, 3]);
        assert_eq!(t.bytes(), 24);
        t.reset(&[3, 1]);
        assert_eq!(t.shape(), &[3, 1]);
        assert_eq!(&t[..], &[0.0; 3]);
        assert!(t.capacity_bytes() >= 24, "reset must keep the allocation");
        t.assign(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[3, 2]);
        t.keep_rows(1..2);
        assert_eq!((t.shape(), &t[..]), (&[1, 2][..], &[3.0, 4.0][..]));
        t.assign(&[4.0, 5.0], &[2]);
        assert_eq!(&t[..], &[4.0, 5.0]);
        t.release();
        assert_eq!((t.bytes(), t.capacity_bytes()), (0, 0));
    }

    #[test]
    #[should_panic(expected = "shape [2, 2] needs 4 elements")]
    fn wrong_length_is_named() {
        Tensor::from_vec(vec![0.0; 3], &[2, 2]);
    }
}
