FORMAT: CSR
LAUNCH: grid=ceil_div(m, 8), block=128
extern "C" __global__ void __launch_bounds__(128) spmv_kernel(
    int m,
    int n,
    int nnz,
    const int* __restrict__ row_ptr,
    const int* __restrict__ col_idx,
    const float* __restrict__ val,
    const float* __restrict__ x,
    float* __restrict__ y)
{
    // 16 lanes per row; groups never straddle a warp, and every lane reaches the shuffles.
    const int lane = threadIdx.x & 15;
    const int row = blockIdx.x * 8 + threadIdx.x / 16;
    float sum = 0.f;
    if (row < m) {
        const int start = __ldg(row_ptr + row);
        const int end = __ldg(row_ptr + row + 1);
        for (int j = start + lane; j < end; j += 16)
            sum = fmaf(__ldg(val + j), __ldg(x + __ldg(col_idx + j)), sum);
    }
    #pragma unroll
    for (int off = 8; off > 0; off >>= 1)
        sum += __shfl_xor_sync(0xffffffffu, sum, off, 16);
    if (lane == 0 && row < m) y[row] = sum;
}
