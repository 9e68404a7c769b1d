// Rotary position embedding (Su et al. 2021), the half-split layout of Llama / Megatron-LM:
// for head dim d and i < d/2, θ_i = pos · base^(−2i/d), the pair (x_i, x_{i+d/2}) is rotated
// by sign·θ_i. In place on x (tokens, heads, d) with a row stride per token (so q and k can be
// rotated inside a fused qkv buffer); pos = token mod seq. The backward pass is the rotation
// by −θ (sign = −1) applied to the gradient. Angles in fp64: pos·θ reaches 10⁴ rad at long
// context, where an fp32 angle would be off by 10⁻³.
template <typename T>
__device__ void rope_impl(T* x, int tokens, int seq, int heads, int head_dim, long long row_stride,
                          float base, float sign) {
    int half = head_dim / 2;
    long long n = (long long)tokens * heads * half;
    for (long long k = blockIdx.x * (long long)blockDim.x + threadIdx.x; k < n;
         k += (long long)gridDim.x * blockDim.x) {
        int i = (int)(k % half);
        long long th = k / half;
        int h = (int)(th % heads);
        int t = (int)(th / heads);
        int pos = t % seq;
        double ang = (double)pos * pow((double)base, -2.0 * i / head_dim);
        double s, c;
        sincos(ang, &s, &c);
        float sn = (float)s * sign, cs = (float)c;
        T* p = x + (long long)t * row_stride + (long long)h * head_dim;
        float a = to_f32(p[i]), b = to_f32(p[i + half]);
        p[i] = from_f32<T>(a * cs - b * sn);
        p[i + half] = from_f32<T>(b * cs + a * sn);
    }
}
#define ROPE(SUF, T)                                                                              \
    extern "C" __global__ void rope_##SUF(T* x, int tokens, int seq, int heads, int head_dim,      \
                                          long long row_stride, float base, float sign) {         \
        rope_impl<T>(x, tokens, seq, heads, head_dim, row_stride, base, sign);                    \
    }
ROPE(f32, float)
ROPE(bf16, bf16_t)
