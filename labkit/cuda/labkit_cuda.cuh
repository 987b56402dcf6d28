// labkit_cuda.cuh: the launchers of labkit's teaching CUDA kernels.
//
// Each launcher takes raw device pointers, sizes and the CUDA stream to run on, launches its
// kernel(s) and returns cudaGetLastError() (cudaSuccess when the launch was accepted). They know
// nothing about PyTorch: binding.cpp checks tensors and calls them, so these files compile with
// plain nvcc in seconds. All data is float32, contiguous, row-major.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

namespace labkit {

// out[i] = x[i] + y[i] for i < n.                                      (vector_add.cu)
cudaError_t launch_vector_add(const float* x, const float* y, float* out, int64_t n,
                              cudaStream_t stream);

// c (m x n) = a (m x k) @ b (k x n); one thread per output element.    (matmul.cu)
cudaError_t launch_matmul_naive(const float* a, const float* b, float* c, int m, int n, int k,
                                cudaStream_t stream);

// The same product, staged through shared memory in kMatmulTile x kMatmulTile tiles.
constexpr int kMatmulTile = 32;
cudaError_t launch_matmul_tiled(const float* a, const float* b, float* c, int m, int n, int k,
                                cudaStream_t stream);

// out[0] = sum of x[0..n): pass 1 writes one partial sum per block into `partials`
// (room for kSumMaxBlocks floats), pass 2 sums the partials with one block.  (reduce.cu)
constexpr int kSumThreads = 256;
constexpr int kSumMaxBlocks = 1024;
cudaError_t launch_block_sum(const float* x, int64_t n, float* partials, float* out,
                             cudaStream_t stream);

}  // namespace labkit
