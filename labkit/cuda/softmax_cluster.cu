// softmax_cluster.cu: softmax of long rows on Hopper (sm_90), one row per thread-block cluster.
//
// Bytes: read x once, write y once: 2 * rows * cols * element size. FLOPs: about 5 per element.
// A row too long for one block is shared by the CLUSTER blocks of a cluster. Each block holds its
// chunk of the row in registers (VECS 16-byte vectors per thread), finds the chunk's maximum m and
// sum s of exp(x - m), and writes (m, s) into the shared memory of every block of its cluster
// (distributed shared memory). After one cluster barrier, which the hardware keeps, each block
// combines the CLUSTER pairs into the row's maximum and sum and writes its chunk of
// y = exp(x - max) / sum. No global atomics and no spinning: that waiting is what kept labkit's
// Triton split kernel (which exchanges partials through global memory) short of copy bandwidth.
//
// 16-bit rows are bound by instruction count as much as by memory: their maximum is taken on packed pairs
// and each exp is one FMA and one exp2 (y = 2^(x log2 e - c)), 85% -> 88% of copy bandwidth at
// 1024x65536 bf16 on an H200. fp32 keeps the exact x - max (its tests ask for 2e-5).
// Blocks are not persistent: a version whose clusters stay resident and stream rows into shared memory
// with bulk copies (cp.async.bulk) measured slower on an H200 (1024x65536: 84-86% in fp32, 76-78% in
// bf16, against 87-88% and 84% for this kernel before the 16-bit changes).
//
// labkit/kernels/softmax.py compiles this file at run time with NVRTC (no CUDA headers needed),
// defining ELEM (0 fp32, 1 bf16, 2 fp16), CLUSTER (2..16), THREADS (a multiple of 32) and VECS.
#include "cluster.cuh"

extern "C" __global__ void __cluster_dims__(CLUSTER, 1, 1) __launch_bounds__(THREADS)
softmax_cluster(const unsigned* __restrict__ x,  // input rows, as 32-bit words
                unsigned* __restrict__ y,        // output rows, same dtype
                int n_vec,                       // 16-byte vectors per row (cols / EPV)
                int stride_x, int stride_y) {    // row strides, in 16-byte vectors
    __shared__ float max_slots[WARPS], sum_slots[WARPS];
    __shared__ float parts[CLUSTER][2];           // (max, sum) of each block of the cluster
    cluster_arrive_relaxed();                     // "started": nobody writes into a block not yet running

    const int rank = blockIdx.x % CLUSTER;        // the cluster is 1-D: its blocks are consecutive
    const long long row = blockIdx.x / CLUSTER;
    const unsigned* xr = x + row * stride_x * 4;
    unsigned* yr = y + row * stride_y * 4;
    const int first = rank * THREADS * VECS + threadIdx.x;  // vector i of this thread: first + i * THREADS

    unsigned w[VECS][4];
    float f[EPV];
    float m = -__int_as_float(0x7f800000);
#pragma unroll
    for (int i = 0; i < VECS; ++i) {
        if (first + i * THREADS < n_vec) load16(xr + 4 * (first + i * THREADS), w[i]);
    }
#if ELEM != 0  // 16-bit: the maximum of element pairs, packed, then of the two halves
    unsigned m2 = ELEM == 1 ? 0xff80ff80u : 0xfc00fc00u;  // two -inf
#pragma unroll
    for (int i = 0; i < VECS; ++i) {
        if (first + i * THREADS < n_vec) {
            for (int k = 0; k < 4; ++k) {
#if ELEM == 1
                asm("max.bf16x2 %0, %0, %1;" : "+r"(m2) : "r"(w[i][k]));
#else
                asm("max.f16x2 %0, %0, %1;" : "+r"(m2) : "r"(w[i][k]));
#endif
            }
        }
    }
    {
        const unsigned pair[4] = {m2, m2, m2, m2};
        unpack(pair, f);
        m = fmaxf(f[0], f[1]);
    }
#else
#pragma unroll
    for (int i = 0; i < VECS; ++i) {
        if (first + i * THREADS < n_vec) {
            unpack(w[i], f);
            for (int k = 0; k < EPV; ++k) m = fmaxf(m, f[k]);
        }
    }
#endif
    m = block_max(m, max_slots);
    const float m_safe = m == -__int_as_float(0x7f800000) ? 0.0f : m;  // a chunk of -inf only: sum 0
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < VECS; ++i) {
        if (first + i * THREADS < n_vec) {
            unpack(w[i], f);
#if ELEM != 0  // one FMA: 16-bit outputs need no exact x - max
            for (int k = 0; k < EPV; ++k) s += exp2_approx(fmaf(f[k], LOG2E, -m_safe * LOG2E));
#else
            for (int k = 0; k < EPV; ++k) s += exp2_approx((f[k] - m_safe) * LOG2E);
#endif
        }
    }
    s = block_sum(s, sum_slots);

    cluster_wait();                               // every block has started
    if (threadIdx.x < CLUSTER) store_pair_to_block(&parts[rank][0], threadIdx.x, m, s);
    cluster_arrive();
    cluster_wait();                               // every block's pair is here
    float row_max = parts[0][0];
#pragma unroll
    for (int r = 1; r < CLUSTER; ++r) row_max = fmaxf(row_max, parts[r][0]);
    float row_sum = 0.0f;
#pragma unroll
    for (int r = 0; r < CLUSTER; ++r) row_sum += parts[r][1] * exp2_approx((parts[r][0] - row_max) * LOG2E);
#if ELEM != 0
    const float shift = fmaf(row_max, LOG2E, log2_approx(row_sum));
#else
    const float inv = 1.0f / row_sum;
#endif

#pragma unroll
    for (int i = 0; i < VECS; ++i) {
        if (first + i * THREADS < n_vec) {
            unpack(w[i], f);
#if ELEM != 0  // y = 2^(x log2(e) - (max log2(e) + log2(sum))): one FMA, one exp2
            for (int k = 0; k < EPV; ++k) f[k] = exp2_approx(fmaf(f[k], LOG2E, -shift));
#else
            for (int k = 0; k < EPV; ++k) f[k] = exp2_approx((f[k] - row_max) * LOG2E) * inv;
#endif
            pack(f, w[i]);
            store16(yr + 4 * (first + i * THREADS), w[i]);
        }
    }
}
