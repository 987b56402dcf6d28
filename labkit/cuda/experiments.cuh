// experiments.cuh: launchers of notebook 06's measured experiments (experiments.cu).
//
// Raw device pointers, sizes and a stream, like labkit_cuda.cuh; the notebook binds them with
// torch.utils.cpp_extension.load_inline. All data is float32, contiguous, row-major.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

namespace labkit_exp {

// out = 2 * in over an n x n matrix. coalesced: threadIdx.x walks along a row (neighbouring
// threads, neighbouring addresses); otherwise threadIdx.x walks down a column (n floats apart).
cudaError_t launch_scale(const float* in, float* out, int n, bool coalesced, cudaStream_t stream);

// out = in^T (n x n). variant 0: naive (coalesced reads, strided writes); 1: through a
// [32][32] shared tile (bank conflicts on the column reads); 2: a [32][33] tile (no conflicts).
cudaError_t launch_transpose(const float* in, float* out, int n, int variant, cudaStream_t stream);

// out[i] = in[i], grid-stride, `blocks` blocks of `threads` threads, each block asking for
// `smem` bytes of dynamic shared memory it never uses (to limit how many fit on an SM).
// vec4: float4 loads and stores (n must be a multiple of 4, pointers 16-byte aligned).
cudaError_t launch_copy(const float* in, float* out, int64_t n, int blocks, int threads, int smem,
                        bool vec4, cudaStream_t stream);

// c (m x n) = a (m x k) @ b (k x n): 64 x 64 tiles per block of 16 x 16 threads, each thread
// accumulating a 4 x 4 block of c in registers (register tiling).
cudaError_t launch_matmul_regtile(const float* a, const float* b, float* c, int m, int n, int k,
                                  cudaStream_t stream);

// Kernel `which` (0 copy, 1 copy float4, 2 matmul_regtile, 3 transpose [32][32], 4 transpose
// [32][33]): registers per thread, static shared memory per block (bytes), and how many blocks
// of `threads` threads with `smem` dynamic shared bytes fit on one SM (the CUDA occupancy API).
cudaError_t kernel_attributes(int which, int threads, int smem, int* regs, int* static_smem,
                              int* blocks_per_sm);

}  // namespace labkit_exp
