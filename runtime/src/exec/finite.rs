//! Finding the first non-finite value (NaN or infinity) among a rank's gradients, before
//! the optimizer steps on them, and among its parameters, before they are checkpointed.
//! Names follow the checkpoint's arrays: `c0.Layer(3)` is chunk 0's unit `Layer(3)`.

use super::RankExec;

/// The first non-finite value of `v`, if any. The common case (all finite) is one
/// vectorised pass: `x · 0` is 0 for a finite `x` and NaN otherwise, summed in 8 lanes.
fn first_bad(v: &[f32]) -> Option<f64> {
    let mut acc = [0f32; 8];
    let chunks = v.chunks_exact(8);
    let rest = chunks.remainder();
    for c in chunks {
        for (a, x) in acc.iter_mut().zip(c) {
            *a += x * 0.0;
        }
    }
    if acc.iter().chain(rest).all(|x| x.is_finite()) {
        return None;
    }
    v.iter().find(|x| !x.is_finite()).map(|&x| f64::from(x))
}

impl RankExec {
    /// The first owned gradient piece holding a non-finite value: its name and the value.
    pub(super) fn first_nonfinite_grad(&self) -> Option<(String, f64)> {
        for (ci, c) in self.chunks.iter().enumerate() {
            for o in &c.opt {
                let g: Option<&[f32]> = if self.zero < 2 {
                    c.grads.get(&o.unit).and_then(|g| g.get(o.in_unit.clone()))
                } else {
                    c.grad_shards.get(o.bucket).and_then(|g| g.get(o.in_shard.clone()))
                };
                if let Some(x) = g.and_then(first_bad) {
                    return Some((format!("gradient c{ci}.{:?}", o.unit), x));
                }
            }
        }
        None
    }

    /// The first parameter tensor (a unit, or a ZeRO-3 shard of a bucket) holding a
    /// non-finite value: its name and the value.
    pub fn first_nonfinite_param(&self) -> Option<(String, f64)> {
        for (ci, c) in self.chunks.iter().enumerate() {
            for (u, v) in &c.params {
                if let Some(x) = first_bad(v) {
                    return Some((format!("parameters c{ci}.{u:?}"), x));
                }
            }
            for (bi, v) in c.param_shards.iter().enumerate() {
                if let Some(x) = first_bad(v) {
                    return Some((format!("parameter shard c{ci}.bucket{bi}"), x));
                }
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::first_bad;

    #[test]
    fn finds_nan_and_infinities_anywhere() {
        let mut v = vec![1.0f32; 37];
        assert_eq!(first_bad(&v), None);
        for (i, bad) in [(3, f32::NAN), (20, f32::INFINITY), (36, f32::NEG_INFINITY)] {
            let keep = v[i];
            v[i] = bad;
            assert!(first_bad(&v).is_some_and(|x| !x.is_finite()), "at {i}");
            v[i] = keep;
        }
        assert_eq!(first_bad(&[f32::MAX, -f32::MAX]), None, "large finite values are finite");
    }
}
