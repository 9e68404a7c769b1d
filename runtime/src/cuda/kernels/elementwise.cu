// Small pieces between the GEMMs: y += x (residual), y[r, :] += b (bias after a GEMM), and
// db += Σ_r dy[r, :] (bias gradient, one thread per column, rows in order).
template <typename T>
__device__ void add_impl(T* y, const T* x, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x)
        y[i] = from_f32<T>(to_f32(y[i]) + to_f32(x[i]));
}
template <typename T>
__device__ void add_bias_impl(T* y, const T* b, long long rows, int cols) {
    long long n = rows * cols;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x)
        y[i] = from_f32<T>(to_f32(y[i]) + to_f32(b[i % cols]));
}
// db[c] += Σ_r dy[r, c]. Launched per_cols: a block of 32 × 32 threads per 32 columns (see
// common.cuh's col_combine); row lane l sums rows l, l + 32, …, then the lanes' sums add in
// lane order — the same order for any launch, so deterministic.
template <typename T>
__device__ void col_sum_impl(const T* dy, float* db, long long rows, int cols) {
    int c = blockIdx.x * 32 + (threadIdx.x & 31), lane_row = threadIdx.x >> 5;
    float s = 0.0f;
    if (c < cols)
        for (long long r = lane_row; r < rows; r += 32) s += to_f32(dy[r * cols + c]);
    float total = col_combine(s);
    if (c < cols && lane_row == 0) db[c] += total;
}
#define ELEMENTWISE(SUF, T)                                                                       \
    extern "C" __global__ void add_##SUF(T* y, const T* x, long long n) { add_impl<T>(y, x, n); } \
    extern "C" __global__ void add_bias_##SUF(T* y, const T* b, long long rows, int cols) {       \
        add_bias_impl<T>(y, b, rows, cols);                                                       \
    }                                                                                             \
    extern "C" __global__ void col_sum_##SUF(const T* dy, float* db, long long rows, int cols) {  \
        col_sum_impl<T>(dy, db, rows, cols);                                                      \
    }
ELEMENTWISE(f32, float)
ELEMENTWISE(bf16, bf16_t)
