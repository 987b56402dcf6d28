// reduce.cu: the sum of n floats, in two passes of one kernel.
//
// Bytes: reads 4n (writes a few). FLOPs: n. Bound by memory bandwidth.
//
// Pass 1: a grid of up to kSumMaxBlocks blocks. Each thread adds up a strided slice of x
// (a grid-stride loop, so any n works with a fixed grid), then the block combines its
// threads' sums: first inside each warp with register shuffles (__shfl_down_sync), then the
// warps' sums through shared memory. Thread 0 writes the block's partial sum.
// Pass 2: the same kernel with one block sums the partials into out[0].
// Two passes instead of atomicAdd keep the result deterministic (same input, same bits).
#include "labkit_cuda.cuh"

namespace labkit {

// The sum of v over the 32 lanes of a warp, valid in lane 0. Each step, lane i adds the value
// of lane i + offset: 16, 8, 4, 2, 1 -> five steps, no shared memory, no __syncthreads.
__device__ float warp_sum(float v) {
    for (int offset = 16; offset > 0; offset /= 2) {
        v += __shfl_down_sync(0xffffffffu, v, offset);
    }
    return v;
}

// The sum of v over the block's threads, valid in thread 0 (blockDim.x a multiple of 32).
__device__ float block_sum(float v) {
    __shared__ float warp_sums[32];                   // one slot per warp (at most 1024 / 32)
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    v = warp_sum(v);
    if (lane == 0) warp_sums[warp] = v;               // each warp's lane 0 posts its sum
    __syncthreads();
    const int n_warps = blockDim.x / 32;
    v = (threadIdx.x < n_warps) ? warp_sums[lane] : 0.0f;
    if (warp == 0) v = warp_sum(v);                   // warp 0 adds up the warps' sums
    return v;
}

__global__ void sum_kernel(const float* __restrict__ x, int64_t n, float* __restrict__ out) {
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    // Four independent loads per trip keep more bytes in flight than one.
    float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
    for (; i + 3 * stride < n; i += 4 * stride) {
        s0 += x[i];
        s1 += x[i + stride];
        s2 += x[i + 2 * stride];
        s3 += x[i + 3 * stride];
    }
    for (; i < n; i += stride) s0 += x[i];
    const float total = block_sum((s0 + s1) + (s2 + s3));
    if (threadIdx.x == 0) out[blockIdx.x] = total;    // one partial sum per block
}

cudaError_t launch_block_sum(const float* x, int64_t n, float* partials, float* out,
                             cudaStream_t stream) {
    int64_t blocks = (n + kSumThreads - 1) / kSumThreads;
    if (blocks < 1) blocks = 1;                       // n == 0 still writes out[0] = 0
    if (blocks > kSumMaxBlocks) blocks = kSumMaxBlocks;
    sum_kernel<<<(unsigned)blocks, kSumThreads, 0, stream>>>(x, n, partials);   // pass 1
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    sum_kernel<<<1, kSumThreads, 0, stream>>>(partials, blocks, out);         // pass 2
    return cudaGetLastError();
}

}  // namespace labkit
