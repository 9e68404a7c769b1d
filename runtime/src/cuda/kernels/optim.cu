// AdamW on fp32 master weights (Loshchilov & Hutter 2019), with bias correction at step k:
// m ← β1·m + (1 − β1)·g, v ← β2·v + (1 − β2)·g², θ ← θ − lr·(m̂/(√v̂ + ε) + λ·θ), where
// g = grad·grad_scale (the clipping factor) and λ = weight_decay on decayed elements only.
// bc1 = 1 − β1^k and bc2 = 1 − β2^k come from the host. If `copy` is not null the updated
// weight is also written there in bf16 (the compute copy).
extern "C" __global__ void adamw_step(float* param, const float* grad, float* m, float* v,
                                      bf16_t* copy, long long n, float lr, float beta1,
                                      float beta2, float eps, float weight_decay, float bc1,
                                      float bc2, float grad_scale) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        float g = grad[i] * grad_scale;
        float mi = beta1 * m[i] + (1.0f - beta1) * g;
        float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
        m[i] = mi;
        v[i] = vi;
        float p = param[i];
        p -= lr * ((mi / bc1) / (sqrtf(vi / bc2) + eps) + weight_decay * p);
        param[i] = p;
        if (copy) copy[i] = f32_to_bf16(p);
    }
}

// Σ x² in two passes, deterministic: sum_squares_partial writes one partial per block
// (fp64), sum_partials adds them in order in one block.
extern "C" __global__ void sum_squares_partial(const float* x, long long n, double* partial) {
    double s = 0.0;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        double v = x[i];
        s += v * v;
    }
    __shared__ double part[1024];
    part[threadIdx.x] = s;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w >>= 1) {
        if (threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) partial[blockIdx.x] = part[0];
}

extern "C" __global__ void sum_partials(const double* partial, int n, double* out) {
    __shared__ double part[1024];
    double s = 0.0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) s += partial[i];
    part[threadIdx.x] = s;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w >>= 1) {
        if (threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[0] = part[0];
}

// x ← x·s (gradient clipping by the global norm, s = min(1, max_norm / ‖g‖)).
extern "C" __global__ void scale_f32(float* x, long long n, float s) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x)
        x[i] *= s;
}

// Casts: fp32 master → bf16 compute copy, and bf16 gradients → fp32 accumulation (added).
extern "C" __global__ void cast_f32_bf16(const float* x, bf16_t* y, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x)
        y[i] = f32_to_bf16(x[i]);
}
extern "C" __global__ void accumulate_bf16_f32(const bf16_t* x, float* acc, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x)
        acc[i] += to_f32(x[i]);
}
