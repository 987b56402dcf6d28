// matmul.cu: c (m x n) = a (m x k) @ b (k x n), float32, row-major.
//
// FLOPs: 2mnk. Bytes at least: 4(mk + kn + mn). The naive kernel reads 2k floats from global
// memory for each of its mn outputs (2mnk loads in all); the tiled kernel loads each tile of a
// and b once per block into shared memory and reuses it kMatmulTile times, so global loads
// drop by that factor: 2mnk / kMatmulTile.
//
// Both use 2-D blocks: threadIdx.x walks along a row of c (the column index), threadIdx.y down
// a column (the row index), so neighbouring threads of a warp read neighbouring b and c
// elements (coalesced).
#include "labkit_cuda.cuh"

namespace labkit {

// One thread per output element: a dot product of a row of a and a column of b.
__global__ void matmul_naive_kernel(const float* __restrict__ a, const float* __restrict__ b,
                                    float* __restrict__ c, int m, int n, int k) {
    int row = blockIdx.y * blockDim.y + threadIdx.y;
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= m || col >= n) return;                 // threads past the edge do nothing
    const float* a_row = a + (int64_t)row * k;        // a[row, :]
    float acc = 0.0f;
    for (int i = 0; i < k; ++i) {
        acc += a_row[i] * b[(int64_t)i * n + col];    // a[row, i] * b[i, col]
    }
    c[(int64_t)row * n + col] = acc;
}

// One block per kMatmulTile x kMatmulTile tile of c. The block walks along k one tile at a
// time: all its threads copy one tile of a and one of b into shared memory (one element each),
// wait, multiply the two tiles out of shared memory, wait, and move on.
__global__ void matmul_tiled_kernel(const float* __restrict__ a, const float* __restrict__ b,
                                    float* __restrict__ c, int m, int n, int k) {
    constexpr int T = kMatmulTile;
    __shared__ float a_tile[T][T];
    __shared__ float b_tile[T][T];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int row = blockIdx.y * T + ty;
    const int col = blockIdx.x * T + tx;
    float acc = 0.0f;
    for (int k0 = 0; k0 < k; k0 += T) {
        // Load: thread (ty, tx) fetches a[row, k0 + tx] and b[k0 + ty, col]; zeros off the edge.
        a_tile[ty][tx] = (row < m && k0 + tx < k) ? a[(int64_t)row * k + k0 + tx] : 0.0f;
        b_tile[ty][tx] = (k0 + ty < k && col < n) ? b[(int64_t)(k0 + ty) * n + col] : 0.0f;
        __syncthreads();                              // both tiles complete before anyone reads
#pragma unroll
        for (int i = 0; i < T; ++i) {
            acc += a_tile[ty][i] * b_tile[i][tx];
        }
        __syncthreads();                              // everyone done before the next load
    }
    if (row < m && col < n) c[(int64_t)row * n + col] = acc;
}

static dim3 grid_for(int m, int n, dim3 block) {
    return dim3((n + block.x - 1) / block.x, (m + block.y - 1) / block.y);
}

cudaError_t launch_matmul_naive(const float* a, const float* b, float* c, int m, int n, int k,
                                cudaStream_t stream) {
    if (m == 0 || n == 0) return cudaSuccess;
    dim3 block(16, 16);                               // 256 threads: 16 columns x 16 rows of c
    matmul_naive_kernel<<<grid_for(m, n, block), block, 0, stream>>>(a, b, c, m, n, k);
    return cudaGetLastError();
}

cudaError_t launch_matmul_tiled(const float* a, const float* b, float* c, int m, int n, int k,
                                cudaStream_t stream) {
    if (m == 0 || n == 0) return cudaSuccess;
    dim3 block(kMatmulTile, kMatmulTile);             // 1024 threads, one per element of a tile
    matmul_tiled_kernel<<<grid_for(m, n, block), block, 0, stream>>>(a, b, c, m, n, k);
    return cudaGetLastError();
}

}  // namespace labkit
