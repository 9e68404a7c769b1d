// Token + position embedding over a vocabulary shard (rows [vocab_start, vocab_start + rows)
// of the table live on this rank; other tokens contribute zeros, summed over tp later).
// out[t, :] = wte[tok[t] − vocab_start, :] (if in the shard) + wpe[t mod seq, :] (if wpe).
// One block per token, threads over the hidden dimension.
template <typename T>
__device__ void embed_fwd_impl(const unsigned int* tok, const T* wte, const T* wpe, T* out,
                               int tokens, int seq, int hidden, int vocab_start, int rows) {
    int t = blockIdx.x;
    if (t >= tokens) return;
    int row = (int)tok[t] - vocab_start;
    bool mine = row >= 0 && row < rows;
    int pos = t % seq;
    for (int c = threadIdx.x; c < hidden; c += blockDim.x) {
        float v = mine ? to_f32(wte[(long long)row * hidden + c]) : 0.0f;
        if (wpe) v += to_f32(wpe[(long long)pos * hidden + c]);
        out[(long long)t * hidden + c] = from_f32<T>(v);
    }
}
#define EMBED_FWD(SUF, T)                                                                          \
    extern "C" __global__ void embed_fwd_##SUF(const unsigned int* tok, const T* wte, const T* wpe, \
                                               T* out, int tokens, int seq, int hidden,             \
                                               int vocab_start, int rows) {                         \
        embed_fwd_impl<T>(tok, wte, wpe, out, tokens, seq, hidden, vocab_start, rows);              \
    }
EMBED_FWD(f32, float)
EMBED_FWD(bf16, bf16_t)

// Backward into fp32 gradients: dwte[tok − start] += dout[t], dwpe[t mod seq] += dout[t].
// Tokens repeat, so rows are accumulated with atomics (fp32 sums in an order the hardware
// picks: equal to the CPU reference within rounding, not bit for bit).
template <typename T>
__device__ void embed_bwd_impl(const unsigned int* tok, const T* dout, float* dwte, float* dwpe,
                               int tokens, int seq, int hidden, int vocab_start, int rows) {
    int t = blockIdx.x;
    if (t >= tokens) return;
    int row = (int)tok[t] - vocab_start;
    bool mine = row >= 0 && row < rows;
    int pos = t % seq;
    for (int c = threadIdx.x; c < hidden; c += blockDim.x) {
        float g = to_f32(dout[(long long)t * hidden + c]);
        if (mine) atomicAdd(&dwte[(long long)row * hidden + c], g);
        if (dwpe) atomicAdd(&dwpe[(long long)pos * hidden + c], g);
    }
}
#define EMBED_BWD(SUF, T)                                                                           \
    extern "C" __global__ void embed_bwd_##SUF(const unsigned int* tok, const T* dout, float* dwte,  \
                                               float* dwpe, int tokens, int seq, int hidden,         \
                                               int vocab_start, int rows) {                          \
        embed_bwd_impl<T>(tok, dout, dwte, dwpe, tokens, seq, hidden, vocab_start, rows);            \
    }
EMBED_BWD(f32, float)
EMBED_BWD(bf16, bf16_t)
