// Causal attention, flash-style (Dao et al. 2022): the s×s scores are never stored. For each
// query row an online softmax runs over the key tiles (running max m, sum l, accumulator),
// and the forward pass saves only lse = m + ln l per row; the backward pass recomputes
// P = exp(q·k·scale − lse) tile by tile.
//
// Layout: q, k, v, o, dq, dk, dv point at (token 0, head 0) of their tensor; head h of token
// t sits at base + t·stride + h·d, so the tensors may be views into one fused qkv buffer.
// Tokens are batch-major (t = b·seq + i). GQA: query head h reads kv head h / (hq / hkv).
// lse and delta are fp32 (batch, hq, seq). head_dim ≤ 256.
//
// One warp per row (a query row forward and for dq, a key row for dk and dv); lane c holds
// dims c, c + 32, …; dot products are warp sums. A block of ROWS warps shares each K/V (or
// Q/dO) tile of TILE rows in shared memory. Every sum runs in a fixed order: deterministic.
#define ROWS 8
#define TILE 16
#define MAXD 256
#define PER (MAXD / 32)

template <typename T>
__device__ void load_tile(float* dst, const T* src, long long stride, int first, int count, int d) {
    for (int e = threadIdx.x; e < TILE * d; e += blockDim.x) {
        int r = e / d, c = e % d;
        dst[e] = (r < count) ? to_f32(src[(long long)(first + r) * stride + c]) : 0.0f;
    }
}

template <typename T>
__device__ void attn_fwd_impl(const T* q, const T* k, const T* v, T* o, float* lse, int batch,
                              int seq, int hq, int hkv, int d, long long qs, long long kvs,
                              long long os, float scale) {
    __shared__ float ks[TILE * MAXD];
    __shared__ float vs[TILE * MAXD];
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    int h = blockIdx.y, b = blockIdx.z, hk = h / (hq / hkv);
    int q0 = blockIdx.x * ROWS, i = q0 + w;
    bool live = i < seq;
    long long tok0 = (long long)b * seq;
    float qr[PER], acc[PER];
    for (int p = 0; p < PER; ++p) {
        int c = lane + 32 * p;
        qr[p] = (live && c < d) ? to_f32(q[(tok0 + i) * qs + (long long)h * d + c]) : 0.0f;
        acc[p] = 0.0f;
    }
    float m = NEG_INF, l = 0.0f;
    int last = min(q0 + ROWS, seq);  // keys [0, last) can matter to this block
    for (int js = 0; js < last; js += TILE) {
        int cnt = min(TILE, last - js);
        __syncthreads();
        load_tile(ks, k + tok0 * kvs + (long long)hk * d, kvs, js, cnt, d);
        load_tile(vs, v + tok0 * kvs + (long long)hk * d, kvs, js, cnt, d);
        __syncthreads();
        if (!live) continue;
        for (int jj = 0; jj < cnt && js + jj <= i; ++jj) {
            float part = 0.0f;
            for (int p = 0; p < PER; ++p) {
                int c = lane + 32 * p;
                if (c < d) part += qr[p] * ks[jj * d + c];
            }
            float s = warp_sum(part) * scale;
            float mn = fmaxf(m, s);
            float corr = expf(m - mn), pj = expf(s - mn);
            l = l * corr + pj;
            for (int p = 0; p < PER; ++p) {
                int c = lane + 32 * p;
                if (c < d) acc[p] = acc[p] * corr + pj * vs[jj * d + c];
            }
            m = mn;
        }
    }
    if (!live) return;
    float inv = 1.0f / l;
    for (int p = 0; p < PER; ++p) {
        int c = lane + 32 * p;
        if (c < d) o[(tok0 + i) * os + (long long)h * d + c] = from_f32<T>(acc[p] * inv);
    }
    if (lane == 0) lse[((long long)b * hq + h) * seq + i] = m + logf(l);
}

// delta[b, h, i] = Σ_c dO[i, c]·O[i, c], the row term of the softmax backward.
template <typename T>
__device__ void attn_bwd_delta_impl(const T* o, const T* dout, float* delta, int batch, int seq,
                                    int hq, int d, long long os) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    int h = blockIdx.y, b = blockIdx.z, i = blockIdx.x * ROWS + w;
    if (i >= seq) return;
    long long base = ((long long)b * seq + i) * os + (long long)h * d;
    float part = 0.0f;
    for (int c = lane; c < d; c += 32) part += to_f32(o[base + c]) * to_f32(dout[base + c]);
    float s = warp_sum(part);
    if (lane == 0) delta[((long long)b * hq + h) * seq + i] = s;
}

// dq_i = scale · Σ_{j ≤ i} p_ij (dO_i·v_j − delta_i) k_j. One warp per query row.
template <typename T>
__device__ void attn_bwd_dq_impl(const T* q, const T* k, const T* v, const T* dout,
                                 const float* lse, const float* delta, T* dq, int batch, int seq,
                                 int hq, int hkv, int d, long long qs, long long kvs, long long os,
                                 long long dqs, float scale) {
    __shared__ float ks[TILE * MAXD];
    __shared__ float vs[TILE * MAXD];
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    int h = blockIdx.y, b = blockIdx.z, hk = h / (hq / hkv);
    int q0 = blockIdx.x * ROWS, i = q0 + w;
    bool live = i < seq;
    long long tok0 = (long long)b * seq;
    float qr[PER], dor[PER], acc[PER];
    for (int p = 0; p < PER; ++p) {
        int c = lane + 32 * p;
        bool in = live && c < d;
        qr[p] = in ? to_f32(q[(tok0 + i) * qs + (long long)h * d + c]) : 0.0f;
        dor[p] = in ? to_f32(dout[(tok0 + i) * os + (long long)h * d + c]) : 0.0f;
        acc[p] = 0.0f;
    }
    long long row = ((long long)b * hq + h) * seq + i;
    float li = live ? lse[row] : 0.0f, di = live ? delta[row] : 0.0f;
    int last = min(q0 + ROWS, seq);
    for (int js = 0; js < last; js += TILE) {
        int cnt = min(TILE, last - js);
        __syncthreads();
        load_tile(ks, k + tok0 * kvs + (long long)hk * d, kvs, js, cnt, d);
        load_tile(vs, v + tok0 * kvs + (long long)hk * d, kvs, js, cnt, d);
        __syncthreads();
        if (!live) continue;
        for (int jj = 0; jj < cnt && js + jj <= i; ++jj) {
            float sp = 0.0f, dp = 0.0f;
            for (int p = 0; p < PER; ++p) {
                int c = lane + 32 * p;
                if (c < d) {
                    sp += qr[p] * ks[jj * d + c];
                    dp += dor[p] * vs[jj * d + c];
                }
            }
            float pij = expf(warp_sum(sp) * scale - li);
            float ds = pij * (warp_sum(dp) - di);
            for (int p = 0; p < PER; ++p) {
                int c = lane + 32 * p;
                if (c < d) acc[p] += ds * ks[jj * d + c];
            }
        }
    }
    if (!live) return;
    for (int p = 0; p < PER; ++p) {
        int c = lane + 32 * p;
        if (c < d) dq[(tok0 + i) * dqs + (long long)h * d + c] = from_f32<T>(acc[p] * scale);
    }
}

// For key row j of kv head hk, over the query heads of its group and rows i ≥ j:
// dv_j = Σ p_ij dO_i, dk_j = scale · Σ p_ij (dO_i·v_j − delta_i) q_i. One warp per key row.
template <typename T>
__device__ void attn_bwd_dkdv_impl(const T* q, const T* k, const T* v, const T* dout,
                                   const float* lse, const float* delta, T* dk, T* dv, int batch,
                                   int seq, int hq, int hkv, int d, long long qs, long long kvs,
                                   long long os, long long dkvs, float scale) {
    __shared__ float qsh[TILE * MAXD];
    __shared__ float dsh[TILE * MAXD];
    __shared__ float lsh[TILE];
    __shared__ float dlt[TILE];
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    int hk = blockIdx.y, b = blockIdx.z, group = hq / hkv;
    int k0 = blockIdx.x * ROWS, j = k0 + w;
    bool live = j < seq;
    long long tok0 = (long long)b * seq;
    float kr[PER], vr[PER], dka[PER], dva[PER];
    for (int p = 0; p < PER; ++p) {
        int c = lane + 32 * p;
        bool in = live && c < d;
        kr[p] = in ? to_f32(k[(tok0 + j) * kvs + (long long)hk * d + c]) : 0.0f;
        vr[p] = in ? to_f32(v[(tok0 + j) * kvs + (long long)hk * d + c]) : 0.0f;
        dka[p] = 0.0f;
        dva[p] = 0.0f;
    }
    for (int g = 0; g < group; ++g) {
        int h = hk * group + g;
        long long rows = ((long long)b * hq + h) * seq;
        for (int is = k0; is < seq; is += TILE) {  // queries i ≥ k0 can see some key of the block
            int cnt = min(TILE, seq - is);
            __syncthreads();
            load_tile(qsh, q + tok0 * qs + (long long)h * d, qs, is, cnt, d);
            load_tile(dsh, dout + tok0 * os + (long long)h * d, os, is, cnt, d);
            for (int e = threadIdx.x; e < TILE; e += blockDim.x) {
                lsh[e] = (e < cnt) ? lse[rows + is + e] : 0.0f;
                dlt[e] = (e < cnt) ? delta[rows + is + e] : 0.0f;
            }
            __syncthreads();
            if (!live) continue;
            for (int ii = 0; ii < cnt; ++ii) {
                if (is + ii < j) continue;
                float sp = 0.0f, dp = 0.0f;
                for (int p = 0; p < PER; ++p) {
                    int c = lane + 32 * p;
                    if (c < d) {
                        sp += qsh[ii * d + c] * kr[p];
                        dp += dsh[ii * d + c] * vr[p];
                    }
                }
                float pij = expf(warp_sum(sp) * scale - lsh[ii]);
                float ds = pij * (warp_sum(dp) - dlt[ii]);
                for (int p = 0; p < PER; ++p) {
                    int c = lane + 32 * p;
                    if (c < d) {
                        dva[p] += pij * dsh[ii * d + c];
                        dka[p] += ds * qsh[ii * d + c];
                    }
                }
            }
        }
    }
    if (!live) return;
    for (int p = 0; p < PER; ++p) {
        int c = lane + 32 * p;
        if (c < d) {
            dk[(tok0 + j) * dkvs + (long long)hk * d + c] = from_f32<T>(dka[p] * scale);
            dv[(tok0 + j) * dkvs + (long long)hk * d + c] = from_f32<T>(dva[p]);
        }
    }
}

#define ATTN(SUF, T)                                                                              \
    extern "C" __global__ void __launch_bounds__(ROWS * 32)                                       \
        attn_fwd_##SUF(const T* q, const T* k, const T* v, T* o, float* lse, int batch, int seq,  \
                       int hq, int hkv, int d, long long qs, long long kvs, long long os,         \
                       float scale) {                                                             \
        attn_fwd_impl<T>(q, k, v, o, lse, batch, seq, hq, hkv, d, qs, kvs, os, scale);            \
    }                                                                                             \
    extern "C" __global__ void __launch_bounds__(ROWS * 32)                                       \
        attn_bwd_delta_##SUF(const T* o, const T* dout, float* delta, int batch, int seq, int hq, \
                             int d, long long os) {                                               \
        attn_bwd_delta_impl<T>(o, dout, delta, batch, seq, hq, d, os);                            \
    }                                                                                             \
    extern "C" __global__ void __launch_bounds__(ROWS * 32)                                       \
        attn_bwd_dq_##SUF(const T* q, const T* k, const T* v, const T* dout, const float* lse,    \
                          const float* delta, T* dq, int batch, int seq, int hq, int hkv, int d,  \
                          long long qs, long long kvs, long long os, long long dqs,               \
                          float scale) {                                                          \
        attn_bwd_dq_impl<T>(q, k, v, dout, lse, delta, dq, batch, seq, hq, hkv, d, qs, kvs, os,   \
                            dqs, scale);                                                          \
    }                                                                                             \
    extern "C" __global__ void __launch_bounds__(ROWS * 32)                                       \
        attn_bwd_dkdv_##SUF(const T* q, const T* k, const T* v, const T* dout, const float* lse,  \
                            const float* delta, T* dk, T* dv, int batch, int seq, int hq,         \
                            int hkv, int d, long long qs, long long kvs, long long os,            \
                            long long dkvs, float scale) {                                        \
        attn_bwd_dkdv_impl<T>(q, k, v, dout, lse, delta, dk, dv, batch, seq, hq, hkv, d, qs, kvs, \
                              os, dkvs, scale);                                                   \
    }
ATTN(f32, float)
ATTN(bf16, bf16_t)
