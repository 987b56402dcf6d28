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
// With SVECS > 0 a block holds SVECS more vectors a thread in shared memory, fetched by one bulk copy
// (cp.async.bulk), so half as many blocks share a row: on an H200 clusters of 4 or more blocks ran on
// only 124 of its 132 SMs, clusters of 2 (or 1) on all of them (256x65536 bf16: 78% -> 88% of copy bandwidth).
//
// 16-bit rows are bound by instruction count as much as by memory: their maximum is taken on packed pairs
// and each exp is one FMA and one exp2 (y = 2^(x log2 e - c)), 85% -> 88% of copy bandwidth at
// 1024x65536 bf16 on an H200. fp32 keeps the exact x - max (its tests ask for 2e-5).
// Blocks are not persistent: a version whose clusters stay resident and stream rows into shared memory
// with bulk copies measured slower on an H200 (1024x65536: 84-86% in fp32, 76-78% in bf16, against 87-88%
// and 84% for this kernel before the 16-bit changes).
//
// labkit/kernels/softmax.py compiles this file at run time with NVRTC (no CUDA headers needed),
// defining ELEM (0 fp32, 1 bf16, 2 fp16), CLUSTER (1..16), THREADS (a multiple of 32), VECS and SVECS,
// and launches it with THREADS * SVECS * 16 bytes of dynamic shared memory.
#include "cluster.cuh"

#define NEG_INF (-__int_as_float(0x7f800000))

__device__ __forceinline__ void max_into(const unsigned w[4], unsigned& m2, float& m) {
    // The maximum so far, of 16-bit pairs packed in m2 (one instruction per pair), or of fp32 values in m.
#if ELEM == 0
    for (int k = 0; k < 4; ++k) m = fmaxf(m, __uint_as_float(w[k]));
#else
    for (int k = 0; k < 4; ++k) {
#if ELEM == 1
        asm("max.bf16x2 %0, %0, %1;" : "+r"(m2) : "r"(w[k]));
#else
        asm("max.f16x2 %0, %0, %1;" : "+r"(m2) : "r"(w[k]));
#endif
    }
#endif
}

__device__ __forceinline__ float sum_exp(const unsigned w[4], float m) {  // sum of exp(x - m) over one vector
    float f[EPV], s = 0.0f;
    unpack(w, f);
#pragma unroll
    for (int k = 0; k < EPV; ++k)
#if ELEM != 0  // one FMA: 16-bit outputs need no exact x - max
        s += exp2_approx(fmaf(f[k], LOG2E, -m * LOG2E));
#else
        s += exp2_approx((f[k] - m) * LOG2E);
#endif
    return s;
}

__device__ __forceinline__ void softmax_store(unsigned w[4], unsigned* out, float row_max, float shift, float inv) {
    // One vector of y: 16-bit y = 2^(x log2(e) - shift), shift = max log2(e) + log2(sum); fp32 exp(x - max) * inv.
    float f[EPV];
    unpack(w, f);
#pragma unroll
    for (int k = 0; k < EPV; ++k)
#if ELEM != 0
        f[k] = exp2_approx(fmaf(f[k], LOG2E, -shift));
#else
        f[k] = exp2_approx((f[k] - row_max) * LOG2E) * inv;
#endif
    pack(f, w);
    store16(out, w);
}

extern "C" __global__ void __cluster_dims__(CLUSTER, 1, 1) __launch_bounds__(THREADS)
softmax_cluster(const unsigned* __restrict__ x,  // input rows, as 32-bit words
                unsigned* __restrict__ y,        // output rows, same dtype
                int n_vec,                       // 16-byte vectors per row (cols / EPV)
                int stride_x, int stride_y) {    // row strides, in 16-byte vectors
    extern __shared__ __align__(128) unsigned staged[];  // THREADS * SVECS vectors of the chunk
    __shared__ __align__(8) unsigned long long landed;   // mbarrier: the staged vectors are here
    __shared__ float max_slots[WARPS], sum_slots[WARPS];
    __shared__ float parts[CLUSTER][2];           // (max, sum) of each block of the cluster
    cluster_arrive_relaxed();                     // "started": nobody writes into a block not yet running

    const int rank = blockIdx.x % CLUSTER;        // the cluster is 1-D: its blocks are consecutive
    const long long row = blockIdx.x / CLUSTER;
    const unsigned* xr = x + row * stride_x * 4;
    unsigned* yr = y + row * stride_y * 4;
    const int first = rank * THREADS * (VECS + SVECS) + threadIdx.x;  // register vector i: first + i * THREADS
    const int staged_first = first - threadIdx.x + THREADS * VECS;      // the staged part's first vector
    const int staged_own = max(0, min(THREADS * SVECS, n_vec - staged_first));  // and its length
    if (SVECS) {
        if (threadIdx.x == 0) {
            mbarrier_init(&landed);
            mbarriers_ready();
            mbarrier_expect(&landed, staged_own * 16);
            if (staged_own) bulk_load(staged, xr + 4 * staged_first, staged_own * 16, &landed);
        }
        __syncthreads();  // the mbarrier is set up
    }

    unsigned w[VECS][4];
    float m = NEG_INF;
    unsigned m2 = ELEM == 1 ? 0xff80ff80u : 0xfc00fc00u;  // two 16-bit -inf
#pragma unroll
    for (int i = 0; i < VECS; ++i) {
        if (first + i * THREADS < n_vec) load16(xr + 4 * (first + i * THREADS), w[i]);
    }
#pragma unroll
    for (int i = 0; i < VECS; ++i) {
        if (first + i * THREADS < n_vec) max_into(w[i], m2, m);
    }
    if (SVECS) mbarrier_wait(&landed, 0);
#pragma unroll
    for (int j = 0; j < SVECS; ++j) {
        if (threadIdx.x + j * THREADS < staged_own) {
            unsigned v[4];
            load16_shared(staged + 4 * (threadIdx.x + j * THREADS), v);
            max_into(v, m2, m);
        }
    }
#if ELEM != 0  // the maximum of the two halves
    {
        const unsigned pair[4] = {m2, m2, m2, m2};
        float f[EPV];
        unpack(pair, f);
        m = fmaxf(f[0], f[1]);
    }
#endif
    m = block_max(m, max_slots);
    const float m_safe = m == NEG_INF ? 0.0f : m;  // a chunk of -inf only: sum 0
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < VECS; ++i) {
        if (first + i * THREADS < n_vec) s += sum_exp(w[i], m_safe);
    }
#pragma unroll
    for (int j = 0; j < SVECS; ++j) {
        if (threadIdx.x + j * THREADS < staged_own) {
            unsigned v[4];
            load16_shared(staged + 4 * (threadIdx.x + j * THREADS), v);
            s += sum_exp(v, m_safe);
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
    const float shift = fmaf(row_max, LOG2E, log2_approx(row_sum)), inv = 1.0f / row_sum;

#pragma unroll
    for (int i = 0; i < VECS; ++i) {
        if (first + i * THREADS < n_vec) softmax_store(w[i], yr + 4 * (first + i * THREADS), row_max, shift, inv);
    }
#pragma unroll
    for (int j = 0; j < SVECS; ++j) {
        if (threadIdx.x + j * THREADS < staged_own) {
            unsigned v[4];
            load16_shared(staged + 4 * (threadIdx.x + j * THREADS), v);
            softmax_store(v, yr + 4 * (staged_first + threadIdx.x + j * THREADS), row_max, shift, inv);
        }
    }
}
