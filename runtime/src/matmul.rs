//! Dense f32 matrix multiplication: the one place the runtime calls a GEMM.
//!
//! C ← α · op(A) · op(B) + β · C, with op(X) = X or Xᵀ, all matrices row-major f32 and
//! optionally row-strided (a view of some columns of a wider matrix, as attention reads one
//! head out of the fused QKV activations). Shapes: op(A) is (m, k), op(B) is (k, n), C is
//! (m, n). Cost: 2·m·k·n FLOPs.
//!
//! The kernel is `matrixmultiply::sgemm` (packed, cache-blocked, AVX2/AVX-512 micro-kernels,
//! selected at run time), single-threaded: each rank is its own thread, so threads inside
//! a GEMM would only fight the other ranks for the cores. It is deterministic: the same
//! inputs give bit-identical outputs on the same machine.
//!
//! Shape errors here are programming errors of the caller (shapes come from validated
//! specs), so they panic with the offending sizes rather than return a `Result`.

/// A read-only row-major matrix view: element (i, j) is `data[i * row_stride + j]`.
#[derive(Clone, Copy, Debug)]
pub struct MatRef<'a> {
    pub data: &'a [f32],
    pub rows: usize,
    pub cols: usize,
    /// Distance in elements between the starts of consecutive rows (≥ cols).
    pub row_stride: usize,
}

/// A writable row-major matrix view: element (i, j) is `data[i * row_stride + j]`.
#[derive(Debug)]
pub struct MatMut<'a> {
    pub data: &'a mut [f32],
    pub rows: usize,
    pub cols: usize,
    /// Distance in elements between the starts of consecutive rows (≥ cols).
    pub row_stride: usize,
}

fn check_view(len: usize, rows: usize, cols: usize, row_stride: usize, what: &str) {
    assert!(row_stride >= cols, "{what}: row stride {row_stride} is smaller than its {cols} columns");
    let needed = if rows == 0 || cols == 0 { 0 } else { (rows - 1) * row_stride + cols };
    assert!(
        len >= needed,
        "{what}: a ({rows}, {cols}) view with row stride {row_stride} needs {needed} elements, got {len}"
    );
}

impl<'a> MatRef<'a> {
    /// A contiguous (rows, cols) matrix; `data` must hold exactly rows·cols elements.
    pub fn new(data: &'a [f32], rows: usize, cols: usize) -> Self {
        assert_eq!(data.len(), rows * cols, "matrix of shape ({rows}, {cols}) needs {} elements", rows * cols);
        MatRef { data, rows, cols, row_stride: cols }
    }

    /// A (rows, cols) view whose rows start `row_stride` elements apart.
    pub fn strided(data: &'a [f32], rows: usize, cols: usize, row_stride: usize) -> Self {
        check_view(data.len(), rows, cols, row_stride, "MatRef::strided");
        MatRef { data, rows, cols, row_stride }
    }
}

impl<'a> MatMut<'a> {
    /// A contiguous (rows, cols) matrix; `data` must hold exactly rows·cols elements.
    pub fn new(data: &'a mut [f32], rows: usize, cols: usize) -> Self {
        assert_eq!(data.len(), rows * cols, "matrix of shape ({rows}, {cols}) needs {} elements", rows * cols);
        MatMut { data, rows, cols, row_stride: cols }
    }

    /// A (rows, cols) view whose rows start `row_stride` elements apart.
    pub fn strided(data: &'a mut [f32], rows: usize, cols: usize, row_stride: usize) -> Self {
        check_view(data.len(), rows, cols, row_stride, "MatMut::strided");
        MatMut { data, rows, cols, row_stride }
    }
}

/// Which operands enter the product transposed: `Nt` means A · Bᵀ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transpose {
    Nn,
    Nt,
    Tn,
    Tt,
}

impl Transpose {
    fn flags(self) -> (bool, bool) {
        match self {
            Transpose::Nn => (false, false),
            Transpose::Nt => (false, true),
            Transpose::Tn => (true, false),
            Transpose::Tt => (true, true),
        }
    }
}

/// C ← α · op(A) · op(B) + β · C.
///
/// With β = 0, C is only written, never read, so it may hold anything (even NaN).
///
/// Example, a linear layer y(T, n) = x(T, k) · W(k, n):
/// `matmul(MatRef::new(x, t, k), MatRef::new(w, k, n), MatMut::new(y, t, n), Transpose::Nn, 1.0, 0.0)`.
pub fn matmul(a: MatRef<'_>, b: MatRef<'_>, c: MatMut<'_>, trans: Transpose, alpha: f32, beta: f32) {
    let (ta, tb) = trans.flags();
    // op(A) is (m, k); element (i, p) of op(A) sits at A[i, p] or A[p, i].
    let (m, k) = if ta { (a.cols, a.rows) } else { (a.rows, a.cols) };
    let (kb, n) = if tb { (b.cols, b.rows) } else { (b.rows, b.cols) };
    assert_eq!(k, kb, "matmul: op(A) is ({m}, {k}) but op(B) is ({kb}, {n})");
    assert!(c.rows == m && c.cols == n, "matmul: op(A)·op(B) is ({m}, {n}) but C is ({}, {})", c.rows, c.cols);
    if m == 0 || n == 0 {
        return;
    }
    let (rsa, csa) = if ta { (1, a.row_stride) } else { (a.row_stride, 1) };
    let (rsb, csb) = if tb { (1, b.row_stride) } else { (b.row_stride, 1) };
    // SAFETY: the views were checked at construction to cover every element that sgemm
    // reads ((rows-1)·row_stride + cols ≤ len); the dimension checks above make op(A),
    // op(B) and C agree with (m, k, n); C is a unique mutable borrow, so it aliases neither
    // A nor B; its strides (row_stride ≥ cols, 1) never map two elements to one address.
    unsafe {
        matrixmultiply::sgemm(
            m,
            k,
            n,
            alpha,
            a.data.as_ptr(),
            rsa as isize,
            csa as isize,
            b.data.as_ptr(),
            rsb as isize,
            csb as isize,
            beta,
            c.data.as_mut_ptr(),
            c.row_stride as isize,
            1,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Textbook triple loop in f64: the oracle.
    fn naive(a: &[f32], ar: usize, ac: usize, b: &[f32], br: usize, bc: usize, trans: Transpose) -> Vec<f64> {
        let (ta, tb) = trans.flags();
        let at = |i: usize, p: usize| (if ta { a[p * ac + i] } else { a[i * ac + p] }) as f64;
        let bt = |p: usize, j: usize| (if tb { b[j * bc + p] } else { b[p * bc + j] }) as f64;
        let (m, k) = if ta { (ac, ar) } else { (ar, ac) };
        let n = if tb { br } else { bc };
        let mut c = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                c[i * n + j] = (0..k).map(|p| at(i, p) * bt(p, j)).sum();
            }
        }
        c
    }

    fn filled(n: usize, salt: u32) -> Vec<f32> {
        (0..n)
            .map(|i| (((i as u32).wrapping_mul(2654435761).wrapping_add(salt) >> 8) % 1000) as f32 / 500.0 - 1.0)
            .collect()
    }

    #[test]
    fn all_transposes_match_the_triple_loop_with_alpha_and_beta() {
        let (m, k, n) = (5, 7, 3);
        for trans in [Transpose::Nn, Transpose::Nt, Transpose::Tn, Transpose::Tt] {
            let (ta, tb) = trans.flags();
            let (ar, ac) = if ta { (k, m) } else { (m, k) };
            let (br, bc) = if tb { (n, k) } else { (k, n) };
            let a = filled(ar * ac, 1);
            let b = filled(br * bc, 2);
            let c0 = filled(m * n, 3);
            let mut c = c0.clone();
            matmul(MatRef::new(&a, ar, ac), MatRef::new(&b, br, bc), MatMut::new(&mut c, m, n), trans, 0.5, 2.0);
            let want = naive(&a, ar, ac, &b, br, bc, trans);
            for i in 0..m * n {
                let expect = 0.5 * want[i] + 2.0 * c0[i] as f64;
                // Sums of 7 products of magnitude ≤ 1 in f32: error ≤ 7·2⁻²⁴·7 ≪ 1e-5.
                assert!((c[i] as f64 - expect).abs() < 1e-5, "{trans:?} element {i}: {} vs {expect}", c[i]);
            }
        }
    }

    #[test]
    fn strided_views_read_and_write_only_their_columns() {
        // A (2, 3) block inside a (2, 5) matrix, times a (3, 2) matrix, into a (2, 2) block of
        // a (2, 4) matrix whose other columns must stay untouched.
        let wide = filled(10, 4);
        let b = filled(6, 5);
        let mut out = [9.0f32; 8];
        matmul(
            MatRef::strided(&wide[1..], 2, 3, 5),
            MatRef::new(&b, 3, 2),
            MatMut::strided(&mut out[2..], 2, 2, 4),
            Transpose::Nn,
            1.0,
            0.0,
        );
        let a: Vec<f32> = (0..2).flat_map(|i| wide[i * 5 + 1..i * 5 + 4].to_vec()).collect();
        let want = naive(&a, 2, 3, &b, 3, 2, Transpose::Nn);
        for i in 0..2 {
            assert_eq!(out[i * 4], 9.0);
            assert_eq!(out[i * 4 + 1], 9.0);
            for j in 0..2 {
                assert!((out[i * 4 + 2 + j] as f64 - want[i * 2 + j]).abs() < 1e-5);
            }
        }
    }

    #[test]
    fn beta_zero_overwrites_garbage() {
        let a = filled(4, 6);
        let mut c = vec![f32::NAN; 4];
        matmul(MatRef::new(&a, 2, 2), MatRef::new(&a, 2, 2), MatMut::new(&mut c, 2, 2), Transpose::Nn, 1.0, 0.0);
        assert!(c.iter().all(|x| x.is_finite()), "{c:?}");
    }

    #[test]
    #[should_panic(expected = "op(A) is (2, 3) but op(B) is (2, 2)")]
    fn mismatched_inner_dimensions_are_named() {
        let a = vec![0.0; 6];
        let b = vec![0.0; 4];
        let mut c = vec![0.0; 4];
        matmul(MatRef::new(&a, 2, 3), MatRef::new(&b, 2, 2), MatMut::new(&mut c, 2, 2), Transpose::Nn, 1.0, 0.0);
    }
}
