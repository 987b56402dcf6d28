// vector_add.cu: the "hello world" of CUDA, out = x + y.
//
// Bytes: reads 2n floats, writes n (12n bytes). FLOPs: n. Bound by memory bandwidth.
//
// The launch makes a grid of `blocks` blocks of `threads` threads. Every thread runs the
// kernel body once and finds its element from where it sits in the grid:
//     i = blockIdx.x * blockDim.x + threadIdx.x
// The last block may stick out past n, so each thread checks i < n before touching memory.
#include "labkit_cuda.cuh"

namespace labkit {

__global__ void vector_add_kernel(const float* __restrict__ x, const float* __restrict__ y,
                                  float* __restrict__ out, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;  // this thread's element
    if (i < n) {                                                  // bounds check
        out[i] = x[i] + y[i];
    }
}

cudaError_t launch_vector_add(const float* x, const float* y, float* out, int64_t n,
                              cudaStream_t stream) {
    if (n == 0) return cudaSuccess;                       // an empty grid is a launch error
    const int threads = 256;                              // blockDim.x: a multiple of 32 (a warp)
    const int64_t blocks = (n + threads - 1) / threads;  // gridDim.x: enough blocks to cover n
    if (blocks > 0x7fffffff) return cudaErrorInvalidValue;  // gridDim.x is at most 2^31 - 1
    vector_add_kernel<<<(unsigned)blocks, threads, 0, stream>>>(x, y, out, n);
    return cudaGetLastError();                            // did the launch go through?
}

}  // namespace labkit
