// Element-wise activations. GELU with the tanh approximation (GPT-2, Megatron-LM):
// y = ½x(1 + tanh(√(2/π)(x + 0.044715x³))). SwiGLU (Shazeer 2020, Llama): the gate and up
// projections side by side in one (rows, 2f) buffer, y = silu(g)·u with silu(g) = g·σ(g).
#define GELU_C 0.7978845608028654f

template <typename T>
__device__ void gelu_fwd_impl(const T* x, T* y, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        float v = to_f32(x[i]);
        float u = GELU_C * (v + 0.044715f * v * v * v);
        y[i] = from_f32<T>(0.5f * v * (1.0f + tanhf(u)));
    }
}

// dx = dy·(½(1 + tanh u) + ½x(1 − tanh²u)·√(2/π)(1 + 3·0.044715x²)).
template <typename T>
__device__ void gelu_bwd_impl(const T* x, const T* dy, T* dx, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        float v = to_f32(x[i]);
        float u = GELU_C * (v + 0.044715f * v * v * v);
        float th = tanhf(u);
        float du = GELU_C * (1.0f + 3.0f * 0.044715f * v * v);
        dx[i] = from_f32<T>(to_f32(dy[i]) * (0.5f * (1.0f + th) + 0.5f * v * (1.0f - th * th) * du));
    }
}

// gu (rows, 2f): columns [0, f) the gate g, [f, 2f) the up projection u; y (rows, f).
template <typename T>
__device__ void swiglu_fwd_impl(const T* gu, T* y, long long rows, int f) {
    long long n = rows * f;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        long long r = i / f, c = i % f;
        float g = to_f32(gu[r * 2 * f + c]), u = to_f32(gu[r * 2 * f + f + c]);
        float sg = 1.0f / (1.0f + expf(-g));
        y[i] = from_f32<T>(g * sg * u);
    }
}

// dg = dy·u·σ(g)(1 + g(1 − σ(g))), du = dy·silu(g); written into dgu (rows, 2f).
template <typename T>
__device__ void swiglu_bwd_impl(const T* gu, const T* dy, T* dgu, long long rows, int f) {
    long long n = rows * f;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        long long r = i / f, c = i % f;
        float g = to_f32(gu[r * 2 * f + c]), u = to_f32(gu[r * 2 * f + f + c]);
        float d = to_f32(dy[i]);
        float sg = 1.0f / (1.0f + expf(-g));
        dgu[r * 2 * f + c] = from_f32<T>(d * u * sg * (1.0f + g * (1.0f - sg)));
        dgu[r * 2 * f + f + c] = from_f32<T>(d * g * sg);
    }
}

#define ACT(SUF, T)                                                                               \
    extern "C" __global__ void gelu_fwd_##SUF(const T* x, T* y, long long n) {                    \
        gelu_fwd_impl<T>(x, y, n);                                                                \
    }                                                                                             \
    extern "C" __global__ void gelu_bwd_##SUF(const T* x, const T* dy, T* dx, long long n) {      \
        gelu_bwd_impl<T>(x, dy, dx, n);                                                           \
    }                                                                                             \
    extern "C" __global__ void swiglu_fwd_##SUF(const T* gu, T* y, long long rows, int f) {       \
        swiglu_fwd_impl<T>(gu, y, rows, f);                                                       \
    }                                                                                             \
    extern "C" __global__ void swiglu_bwd_##SUF(const T* gu, const T* dy, T* dgu, long long rows, \
                                                int f) {                                          \
        swiglu_bwd_impl<T>(gu, dy, dgu, rows, f);                                                 \
    }
ACT(f32, float)
ACT(bf16, bf16_t)
