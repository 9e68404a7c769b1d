// Cross-entropy over a vocabulary shard (Megatron-LM's vocab-parallel loss): each tp rank
// holds logits (rows, V_local) for vocabulary ids [vocab_start, vocab_start + V_local).
// 1. xent_stats: per row, (local max, Σ exp(x − local max), the target's logit or 0) →
//    stats (rows, 3), which the ranks all-gather as (tp, rows, 3);
// 2. xent_combine: lse = M + ln Σ_r s_r·exp(m_r − M) with M = max_r m_r, loss = lse − target;
// 3. xent_grad: dlogits = (exp(x − lse) − [id = target])·scale, in place.
template <typename T>
__device__ void xent_stats_impl(const T* logits, const unsigned int* target, float* stats,
                                int rows, int cols, int vocab_start) {
    int r = blockIdx.x;
    if (r >= rows) return;
    const T* x = logits + (long long)r * cols;
    float m = NEG_INF;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, to_f32(x[c]));
    m = block_max(m);
    float s = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) s += expf(to_f32(x[c]) - m);
    s = block_sum(s);
    if (threadIdx.x == 0) {
        int t = (int)target[r] - vocab_start;
        stats[3 * r] = m;
        stats[3 * r + 1] = s;
        stats[3 * r + 2] = (t >= 0 && t < cols) ? to_f32(x[t]) : 0.0f;
    }
}

// gathered (tp, rows, 3) → lse (rows), loss (rows). One thread per row.
extern "C" __global__ void xent_combine(const float* gathered, float* lse, float* loss, int rows,
                                        int tp) {
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    float mx = NEG_INF;
    for (int k = 0; k < tp; ++k) mx = fmaxf(mx, gathered[3 * ((long long)k * rows + r)]);
    float s = 0.0f, tg = 0.0f;
    for (int k = 0; k < tp; ++k) {
        const float* st = gathered + 3 * ((long long)k * rows + r);
        s += st[1] * expf(st[0] - mx);
        tg += st[2];
    }
    float l = mx + logf(s);
    lse[r] = l;
    loss[r] = l - tg;
}

// Rows stride over the blocks and columns over each block's threads (any launch works): no
// 64-bit division per element, which over a 50k vocabulary cost more than the exponentials.
template <typename T>
__device__ void xent_grad_impl(T* logits, const unsigned int* target, const float* lse, int rows,
                               int cols, int vocab_start, float scale) {
    for (int r = blockIdx.x; r < rows; r += gridDim.x) {
        T* x = logits + (long long)r * cols;
        float l = lse[r];
        int t = (int)target[r] - vocab_start;
        for (int c = threadIdx.x; c < cols; c += blockDim.x) {
            float p = expf(to_f32(x[c]) - l);
            if (c == t) p -= 1.0f;
            x[c] = from_f32<T>(p * scale);
        }
    }
}

#define XENT(SUF, T)                                                                              \
    extern "C" __global__ void xent_stats_##SUF(const T* logits, const unsigned int* target,      \
                                                float* stats, int rows, int cols,                 \
                                                int vocab_start) {                                \
        xent_stats_impl<T>(logits, target, stats, rows, cols, vocab_start);                       \
    }                                                                                             \
    extern "C" __global__ void xent_grad_##SUF(T* logits, const unsigned int* target,             \
                                               const float* lse, int rows, int cols,              \
                                               int vocab_start, float scale) {                    \
        xent_grad_impl<T>(logits, target, lse, rows, cols, vocab_start, scale);                   \
    }
XENT(f32, float)
XENT(bf16, bf16_t)
