// Shared by every Strata kernel (prepended by the Rust side before NVRTC compiles a file).
// Storage types: `float` and bf16 kept as its 16 bits (`bf16_t`); arithmetic is always fp32.
// bf16 is converted by hand so that no CUDA header is needed: NVRTC compiles these sources
// on a machine with only the NVRTC library.
typedef unsigned short bf16_t;
#define NEG_INF __int_as_float(0xff800000)
// Each kernel is instantiated once per storage type, with C names the Rust side looks up:
// NAME_f32 and NAME_bf16.

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(bf16_t x) { return __uint_as_float(((unsigned int)x) << 16); }

// Round to nearest even; NaN stays a (quiet) NaN.
__device__ __forceinline__ bf16_t f32_to_bf16(float f) {
    unsigned int u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (bf16_t)(u >> 16);
}

template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ bf16_t from_f32<bf16_t>(float x) { return f32_to_bf16(x); }

// Sum over a warp, then over the block (blockDim.x a multiple of 32, at most 1024).
__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ float block_sum(float v) {
    __shared__ float part[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) part[warp] = v;
    __syncthreads();
    float r = (threadIdx.x < warps) ? part[threadIdx.x] : 0.0f;
    if (warp == 0) r = warp_sum(r);
    if (threadIdx.x == 0) part[0] = r;
    __syncthreads();
    return part[0];
}
__device__ float block_max(float v) {
    __shared__ float part[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) part[warp] = v;
    __syncthreads();
    float r = (threadIdx.x < warps) ? part[threadIdx.x] : NEG_INF;
    if (warp == 0) r = warp_max(r);
    if (threadIdx.x == 0) part[0] = r;
    __syncthreads();
    return part[0];
}

// Column reductions (launched per_cols: blockDim.x = 1024, 32 columns × 32 row lanes): the
// 32 row lanes' partial sums of this thread's column, added in lane order 0, 1, …, 31 — the
// result for lane row 0 (every thread of the block must call it).
__device__ float col_combine(float v) {
    __shared__ float part[32][33];
    int col = threadIdx.x & 31, lane_row = threadIdx.x >> 5;
    __syncthreads();
    part[lane_row][col] = v;
    __syncthreads();
    float total = 0.0f;
    if (lane_row == 0)
        for (int l = 0; l < 32; ++l) total += part[l][col];
    return total;
}
