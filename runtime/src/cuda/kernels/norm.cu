// LayerNorm (Ba et al. 2016) and RMSNorm (Zhang & Sennrich 2019) over rows of x (rows, cols).
// LayerNorm: y = (x − μ)·rstd·γ + β, rstd = 1/√(var + ε). RMSNorm: y = x·rstd·γ,
// rstd = 1/√(mean(x²) + ε). Statistics are fp32 and saved for the backward pass (μ = 0 for
// RMSNorm). One block per row; the parameter gradients are column sums in a second kernel
// (one thread per column, rows in order: deterministic).
template <typename T>
__device__ void norm_fwd_impl(const T* x, const T* gamma, const T* beta, T* y, float* mean,
                              float* rstd, int rows, int cols, float eps, bool rms) {
    int r = blockIdx.x;
    if (r >= rows) return;
    const T* xr = x + (long long)r * cols;
    float s = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) s += to_f32(xr[c]);
    float mu = rms ? 0.0f : block_sum(s) / cols;
    float q = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        float d = to_f32(xr[c]) - mu;
        q += d * d;
    }
    float rs = rsqrtf(block_sum(q) / cols + eps);
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        float v = (to_f32(xr[c]) - mu) * rs * to_f32(gamma[c]);
        if (beta) v += to_f32(beta[c]);
        y[(long long)r * cols + c] = from_f32<T>(v);
    }
    if (threadIdx.x == 0) {
        if (mean) mean[r] = mu;
        rstd[r] = rs;
    }
}
#define NORM_FWD(SUF, T)                                                                        \
    extern "C" __global__ void layernorm_fwd_##SUF(const T* x, const T* gamma, const T* beta,    \
                                                   T* y, float* mean, float* rstd, int rows,     \
                                                   int cols, float eps) {                        \
        norm_fwd_impl<T>(x, gamma, beta, y, mean, rstd, rows, cols, eps, false);                 \
    }                                                                                            \
    extern "C" __global__ void rmsnorm_fwd_##SUF(const T* x, const T* gamma, T* y, float* rstd,  \
                                                 int rows, int cols, float eps) {                \
        norm_fwd_impl<T>(x, gamma, (const T*)0, y, (float*)0, rstd, rows, cols, eps, true);      \
    }
NORM_FWD(f32, float)
NORM_FWD(bf16, bf16_t)

// dx = rstd·(g − mean(g) − x̂·mean(g·x̂)) with g = dy·γ, x̂ = (x − μ)·rstd (LayerNorm);
// RMSNorm drops the mean(g) term. dx is written (not accumulated), in T.
template <typename T>
__device__ void norm_bwd_dx_impl(const T* dy, const T* x, const T* gamma, const float* mean,
                                 const float* rstd, T* dx, int rows, int cols, bool rms) {
    int r = blockIdx.x;
    if (r >= rows) return;
    long long o = (long long)r * cols;
    float mu = rms ? 0.0f : mean[r], rs = rstd[r];
    float gs = 0.0f, gx = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        float g = to_f32(dy[o + c]) * to_f32(gamma[c]);
        gs += g;
        gx += g * (to_f32(x[o + c]) - mu) * rs;
    }
    float g_mean = rms ? 0.0f : block_sum(gs) / cols;
    float gx_mean = block_sum(gx) / cols;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        float xhat = (to_f32(x[o + c]) - mu) * rs;
        float g = to_f32(dy[o + c]) * to_f32(gamma[c]);
        dx[o + c] = from_f32<T>(rs * (g - g_mean - xhat * gx_mean));
    }
}

// dγ[c] += Σ_r dy[r, c]·x̂[r, c], dβ[c] += Σ_r dy[r, c] (fp32; dbeta may be null).
// Launched per_cols (a block of 32 × 32 threads per 32 columns): row lane l sums rows l,
// l + 32, …, and the lanes' sums add in lane order (common.cuh's col_combine): deterministic.
template <typename T>
__device__ void norm_bwd_params_impl(const T* dy, const T* x, const float* mean, const float* rstd,
                                     float* dgamma, float* dbeta, int rows, int cols, bool rms) {
    int c = blockIdx.x * 32 + (threadIdx.x & 31), lane_row = threadIdx.x >> 5;
    float dg = 0.0f, db = 0.0f;
    if (c < cols)
        for (int r = lane_row; r < rows; r += 32) {
            long long o = (long long)r * cols + c;
            float g = to_f32(dy[o]);
            float mu = rms ? 0.0f : mean[r];
            dg += g * (to_f32(x[o]) - mu) * rstd[r];
            db += g;
        }
    dg = col_combine(dg);
    db = col_combine(db);
    if (c >= cols || lane_row != 0) return;
    dgamma[c] += dg;
    if (dbeta) dbeta[c] += db;
}
#define NORM_BWD(SUF, T)                                                                           \
    extern "C" __global__ void layernorm_bwd_dx_##SUF(const T* dy, const T* x, const T* gamma,      \
                                                      const float* mean, const float* rstd, T* dx,  \
                                                      int rows, int cols) {                         \
        norm_bwd_dx_impl<T>(dy, x, gamma, mean, rstd, dx, rows, cols, false);                       \
    }                                                                                               \
    extern "C" __global__ void rmsnorm_bwd_dx_##SUF(const T* dy, const T* x, const T* gamma,        \
                                                    const float* rstd, T* dx, int rows, int cols) { \
        norm_bwd_dx_impl<T>(dy, x, gamma, rstd, rstd, dx, rows, cols, true);                        \
    }                                                                                               \
    extern "C" __global__ void layernorm_bwd_params_##SUF(const T* dy, const T* x,                  \
                                                          const float* mean, const float* rstd,     \
                                                          float* dgamma, float* dbeta, int rows,    \
                                                          int cols) {                               \
        norm_bwd_params_impl<T>(dy, x, mean, rstd, dgamma, dbeta, rows, cols, false);               \
    }                                                                                               \
    extern "C" __global__ void rmsnorm_bwd_params_##SUF(const T* dy, const T* x, const float* rstd, \
                                                        float* dgamma, int rows, int cols) {        \
        norm_bwd_params_impl<T>(dy, x, rstd, rstd, dgamma, (float*)0, rows, cols, true);            \
    }
NORM_BWD(f32, float)
NORM_BWD(bf16, bf16_t)
