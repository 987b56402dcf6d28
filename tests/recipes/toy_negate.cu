// toy_negate.cu: out = -x (CONTRIBUTING, 'Add a CUDA C kernel'; tests/test_recipes.py adds it to a copy).
#include "labkit_cuda.cuh"

namespace labkit {

__global__ void negate_kernel(const float* __restrict__ x, float* __restrict__ out, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = -x[i];
}

cudaError_t launch_negate(const float* x, float* out, int64_t n, cudaStream_t stream) {
    if (n == 0) return cudaSuccess;
    const int threads = 256;
    const int64_t blocks = (n + threads - 1) / threads;
    if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
    negate_kernel<<<(unsigned)blocks, threads, 0, stream>>>(x, out, n);
    return cudaGetLastError();
}

}  // namespace labkit
