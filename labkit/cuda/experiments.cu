// experiments.cu: small kernels for notebook 06's measured experiments.
//
// - scale (coalesced or not): 8 bytes per element either way; uncoalesced, each warp's load
//   touches 32 separate 32-byte sectors and uses 4 bytes of each.
// - transpose: 8 bytes per element; a shared-memory tile makes both global reads and writes
//   coalesced, and one float of padding per tile row removes the 32-way bank conflict of
//   reading a tile column.
// - copy: 8 bytes per element, with a chosen number of resident blocks (occupancy) and scalar
//   or float4 accesses (bytes in flight per thread).
// - matmul_regtile: 2mnk FLOPs; each thread keeps a 4 x 4 block of c in registers, so each
//   value read from shared memory feeds 4 FMAs instead of 1.
#include "experiments.cuh"

namespace labkit_exp {

constexpr int kTile = 32;      // transpose tile
constexpr int kTileRows = 8;   // a 32 x 8 block walks its tile 8 rows at a time

__global__ void scale_coalesced_kernel(const float* __restrict__ in, float* __restrict__ out, int n) {
    const int col = blockIdx.x * blockDim.x + threadIdx.x;   // threadIdx.x: along a row
    const int row = blockIdx.y * blockDim.y + threadIdx.y;
    if (row < n && col < n) out[(int64_t)row * n + col] = 2.0f * in[(int64_t)row * n + col];
}

__global__ void scale_uncoalesced_kernel(const float* __restrict__ in, float* __restrict__ out, int n) {
    const int row = blockIdx.x * blockDim.x + threadIdx.x;   // threadIdx.x: down a column
    const int col = blockIdx.y * blockDim.y + threadIdx.y;
    if (row < n && col < n) out[(int64_t)row * n + col] = 2.0f * in[(int64_t)row * n + col];
}

cudaError_t launch_scale(const float* in, float* out, int n, bool coalesced, cudaStream_t stream) {
    if (n == 0) return cudaSuccess;
    const dim3 block(32, 8);
    const dim3 grid((n + block.x - 1) / block.x, (n + block.y - 1) / block.y);
    if (coalesced) {
        scale_coalesced_kernel<<<grid, block, 0, stream>>>(in, out, n);
    } else {
        scale_uncoalesced_kernel<<<grid, block, 0, stream>>>(in, out, n);
    }
    return cudaGetLastError();
}

__global__ void transpose_naive_kernel(const float* __restrict__ in, float* __restrict__ out, int n) {
    const int x = blockIdx.x * kTile + threadIdx.x;
    const int y = blockIdx.y * kTile + threadIdx.y;
    for (int j = 0; j < kTile; j += kTileRows) {
        if (x < n && y + j < n) out[(int64_t)x * n + y + j] = in[(int64_t)(y + j) * n + x];
    }
}

// PAD = 0: tile[i][threadIdx.x] for fixed i is one row (32 banks, no conflict), but reading
// tile[threadIdx.x][i] walks a column: 32 addresses 32 floats apart, all in one bank.
// PAD = 1: a row is 33 floats, so a column's addresses fall in 32 different banks.
template <int PAD>
__global__ void transpose_shared_kernel(const float* __restrict__ in, float* __restrict__ out, int n) {
    __shared__ float tile[kTile][kTile + PAD];
    int x = blockIdx.x * kTile + threadIdx.x;
    int y = blockIdx.y * kTile + threadIdx.y;
    for (int j = 0; j < kTile; j += kTileRows) {
        if (x < n && y + j < n) tile[threadIdx.y + j][threadIdx.x] = in[(int64_t)(y + j) * n + x];
    }
    __syncthreads();
    x = blockIdx.y * kTile + threadIdx.x;   // the transposed tile: write along rows of out
    y = blockIdx.x * kTile + threadIdx.y;
    for (int j = 0; j < kTile; j += kTileRows) {
        if (x < n && y + j < n) out[(int64_t)(y + j) * n + x] = tile[threadIdx.x][threadIdx.y + j];
    }
}

cudaError_t launch_transpose(const float* in, float* out, int n, int variant, cudaStream_t stream) {
    if (n == 0) return cudaSuccess;
    const dim3 block(kTile, kTileRows);
    const dim3 grid((n + kTile - 1) / kTile, (n + kTile - 1) / kTile);
    if (variant == 0) {
        transpose_naive_kernel<<<grid, block, 0, stream>>>(in, out, n);
    } else if (variant == 1) {
        transpose_shared_kernel<0><<<grid, block, 0, stream>>>(in, out, n);
    } else {
        transpose_shared_kernel<1><<<grid, block, 0, stream>>>(in, out, n);
    }
    return cudaGetLastError();
}

__global__ void copy_kernel(const float* __restrict__ in, float* __restrict__ out, int64_t n) {
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) out[i] = in[i];
}

__global__ void copy4_kernel(const float4* __restrict__ in, float4* __restrict__ out, int64_t n4) {
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += stride) out[i] = in[i];
}

cudaError_t launch_copy(const float* in, float* out, int64_t n, int blocks, int threads, int smem,
                        bool vec4, cudaStream_t stream) {
    if (n == 0) return cudaSuccess;
    cudaError_t err;
    if (vec4) {
        err = cudaFuncSetAttribute(copy4_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
        if (err != cudaSuccess) return err;
        copy4_kernel<<<blocks, threads, smem, stream>>>(reinterpret_cast<const float4*>(in),
                                                        reinterpret_cast<float4*>(out), n / 4);
    } else {
        err = cudaFuncSetAttribute(copy_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
        if (err != cudaSuccess) return err;
        copy_kernel<<<blocks, threads, smem, stream>>>(in, out, n);
    }
    return cudaGetLastError();
}

constexpr int kBM = 64, kBN = 64, kBK = 16;   // block tile of c, and the k step
constexpr int kThreads = 256;                 // 16 x 16 threads, 4 x 4 outputs each

__global__ void __launch_bounds__(kThreads) matmul_regtile_kernel(const float* __restrict__ a,
                                                                   const float* __restrict__ b,
                                                                   float* __restrict__ c, int m, int n, int k) {
    __shared__ float as[kBK][kBM + 1];   // the a tile stored k-major, so a thread's 4 rows are one row here
    __shared__ float bs[kBK][kBN];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int tid = ty * 16 + tx;
    const int row0 = blockIdx.y * kBM, col0 = blockIdx.x * kBN;
    float acc[4][4] = {};
    for (int k0 = 0; k0 < k; k0 += kBK) {
#pragma unroll
        for (int r = 0; r < 4; ++r) {         // 1024 elements of each tile, 4 per thread
            const int e = tid + kThreads * r;
            const int ar = e / kBK, ak = e % kBK;     // a: consecutive threads along k
            const int gr = row0 + ar, gk = k0 + ak;
            as[ak][ar] = (gr < m && gk < k) ? a[(int64_t)gr * k + gk] : 0.0f;
            const int bk = e / kBN, bc = e % kBN;     // b: consecutive threads along a row
            const int gbk = k0 + bk, gc = col0 + bc;
            bs[bk][bc] = (gbk < k && gc < n) ? b[(int64_t)gbk * n + gc] : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < kBK; ++kk) {
            float ar[4], br[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) ar[i] = as[kk][ty + 16 * i];
#pragma unroll
            for (int j = 0; j < 4; ++j) br[j] = bs[kk][tx + 16 * j];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[i][j] += ar[i] * br[j];   // 16 FMAs for 8 shared loads
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int r = row0 + ty + 16 * i, cc = col0 + tx + 16 * j;
            if (r < m && cc < n) c[(int64_t)r * n + cc] = acc[i][j];
        }
    }
}

cudaError_t launch_matmul_regtile(const float* a, const float* b, float* c, int m, int n, int k,
                                  cudaStream_t stream) {
    if (m == 0 || n == 0) return cudaSuccess;
    const dim3 block(16, 16);
    const dim3 grid((n + kBN - 1) / kBN, (m + kBM - 1) / kBM);
    matmul_regtile_kernel<<<grid, block, 0, stream>>>(a, b, c, m, n, k);
    return cudaGetLastError();
}

template <typename Kernel>
static cudaError_t attributes_of(Kernel kernel, int threads, int smem, int* regs, int* static_smem,
                                 int* blocks_per_sm) {
    cudaFuncAttributes attr;
    cudaError_t err = cudaFuncGetAttributes(&attr, kernel);
    if (err != cudaSuccess) return err;
    *regs = attr.numRegs;
    *static_smem = (int)attr.sharedSizeBytes;
    if (smem > 0) {
        err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
        if (err != cudaSuccess) return err;
    }
    return cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks_per_sm, kernel, threads, smem);
}

cudaError_t kernel_attributes(int which, int threads, int smem, int* regs, int* static_smem,
                              int* blocks_per_sm) {
    switch (which) {
        case 0: return attributes_of(copy_kernel, threads, smem, regs, static_smem, blocks_per_sm);
        case 1: return attributes_of(copy4_kernel, threads, smem, regs, static_smem, blocks_per_sm);
        case 2: return attributes_of(matmul_regtile_kernel, threads, smem, regs, static_smem, blocks_per_sm);
        case 3: return attributes_of(transpose_shared_kernel<0>, threads, smem, regs, static_smem, blocks_per_sm);
        case 4: return attributes_of(transpose_shared_kernel<1>, threads, smem, regs, static_smem, blocks_per_sm);
        default: return cudaErrorInvalidValue;
    }
}

}  // namespace labkit_exp
