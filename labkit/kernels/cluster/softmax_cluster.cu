// softmax_cluster.cu: softmax of long rows on Hopper (sm_90), one row per thread-block cluster.
//
// Bytes: read x once, write y once: 2 * rows * cols * element size. FLOPs: about 5 per element.
// A row too long for one block is shared by the CLUSTER blocks of a cluster. Each block holds its
// chunk of the row on chip (VECS 16-byte vectors per thread in registers, SVECS more in shared memory),
// finds the chunk's maximum m and sum s of exp(x - m), and writes (m, s) into the shared memory of every
// block of its cluster (distributed shared memory). After one cluster barrier, which the hardware keeps,
// each block combines the CLUSTER pairs into the row's maximum and sum and writes its chunk of y.
// No global atomics and no spinning: that waiting is what kept labkit's Triton split kernel (which
// exchanges partials through global memory) short of copy bandwidth.
//
// One pass over the chunk while it lands, one multiply to write it out. Each thread folds its vectors into a
// running (max, sum) a group at a time, in the order they arrive: first the shared-memory part, fetched by
// CHUNKS bulk copies (cp.async.bulk) issued first, each counted by its own mbarrier, then its registers. It
// replaces each x by e = exp(x - m_g), m_g the running maximum after x's group, and keeps the m_g, so that
// y = e * exp(m_g - row max) / row sum costs one multiply per element and no second exp. On an H200 at
// 256x131072 bf16 (two blocks a row, twice as many blocks as fit at once), two passes after the loads (maximum,
// then sum) and a second exp per element on the way out gave 78% of copy bandwidth; this gives 81%.
// The price, for 16-bit rows: y is rounded twice (e to fp16, then y), so about 3% of bf16 outputs are one unit in
// the last place away from the correctly rounded value (0.01% before), and outputs under 2^-29 of their group's
// maximum have an absolute error up to 2^-40 (see E_SHIFT).
//
// SVECS > 0 halves the blocks a row takes: on an H200 clusters of 4 or more blocks ran on only 124 of its 132
// SMs, clusters of 2 (or 1) on all of them (256x65536 bf16: 78% -> 88% of copy bandwidth). A thread keeps 64
// registers (the launch bound), so two blocks of 512 threads fit an SM.
// 16-bit maxima are taken on packed pairs and each exp is one FMA and one exp2 (e = 2^(x log2 e - m log2 e));
// fp32 keeps the exact x - m (its tests ask for 2e-5). Blocks are not persistent: a version whose clusters stay
// resident and stream rows into shared memory with bulk copies measured slower on an H200.
//
// labkit/kernels/softmax.py compiles this file at run time with NVRTC (no CUDA headers needed),
// defining ELEM (0 fp32, 1 bf16, 2 fp16), CLUSTER (1..16), THREADS (a multiple of 32), VECS and SVECS,
// and launches it with THREADS * SVECS * 16 bytes of dynamic shared memory.
#include "cluster.cuh"

#define CHUNKS 2  // bulk copies of the shared-memory part, each with its mbarrier
#define GROUP 8   // register vectors folded in at a time
// 16-bit rows keep e as fp16 times 2^E_SHIFT: 11 significant bits (bf16 has 8) keep y's relative error under
// 2^-8 + 2^-11; e <= 1, so e 2^15 <= 32768 fits fp16 (largest 65504) and every e down to 2^-29 is a normal fp16
// (below that, fp16's subnormals: an absolute error up to 2^-40). Sums of e carry the same 2^15, which cancels.
#define E_SHIFT 15.0f
static_assert(SVECS % CHUNKS == 0 && VECS % GROUP == 0, "SVECS must be a multiple of CHUNKS, VECS of GROUP");

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

__device__ __forceinline__ float exp_in_place(unsigned w[4], float m) {
    // w <- e = exp(x - m) as the kernel keeps it (see E_SHIFT); returns the sum of the e.
    float f[EPV], s = 0.0f;
    unpack(w, f);
#if ELEM == 0
#pragma unroll
    for (int k = 0; k < EPV; ++k) {
        f[k] = exp2_approx((f[k] - m) * LOG2E);
        s += f[k];
    }
    pack(f, w);
#else  // one FMA: 16-bit outputs need no exact x - m
    const float shift = fmaf(-m, LOG2E, E_SHIFT);
#pragma unroll
    for (int k = 0; k < EPV; ++k) {
        f[k] = exp2_approx(fmaf(f[k], LOG2E, shift));
        s += f[k];
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) w[k] = pack_f16(f[2 * k], f[2 * k + 1]);
#endif
    return s;
}

template <int N>
__device__ __forceinline__ float online_group(unsigned (*v)[4], const bool* ok, float& m, float& s) {
    // Fold N vectors into the running (max m, sum s of exp(x - m)), replacing each x by exp(x - m) for the m
    // returned (the running max after them).
    unsigned m2 = ELEM == 1 ? 0xff80ff80u : 0xfc00fc00u;
    float cm = NEG_INF;
#pragma unroll
    for (int i = 0; i < N; ++i) if (ok[i]) max_into(v[i], m2, cm);
#if ELEM != 0
    {
        const unsigned pair[4] = {m2, m2, m2, m2};
        float f[EPV];
        unpack(pair, f);
        cm = fmaxf(f[0], f[1]);
    }
#endif
    if (cm > m) {
        s *= exp2_approx((m - cm) * LOG2E);  // m = -inf: s is 0 and stays 0
        m = cm;
    }
    const float m_safe = m == NEG_INF ? 0.0f : m;
#pragma unroll
    for (int i = 0; i < N; ++i) if (ok[i]) s += exp_in_place(v[i], m_safe);
    return m;
}

__device__ __forceinline__ void scale_store(const unsigned w[4], unsigned* out, float scale) {
    // y = e * scale, in the output's type
    float f[EPV];
#if ELEM == 0
    unpack(w, f);
#else
#pragma unroll
    for (int k = 0; k < 4; ++k) unpack_f16(w[k], f[2 * k], f[2 * k + 1]);
#endif
    unsigned o[4];
#pragma unroll
    for (int k = 0; k < EPV; ++k) f[k] *= scale;
    pack(f, o);
    store16(out, o);
}

extern "C" __global__ void __cluster_dims__(CLUSTER, 1, 1) __launch_bounds__(THREADS, 65536 / 64 / THREADS)
softmax_cluster(const unsigned* __restrict__ x,  // input rows, as 32-bit words
                unsigned* __restrict__ y,        // output rows, same dtype
                int n_vec,                       // 16-byte vectors per row (cols / EPV)
                int stride_x, int stride_y) {    // row strides, in 16-byte vectors
    constexpr int CHUNK = SVECS ? SVECS / CHUNKS : 1;  // vectors a thread has in each bulk copy
    constexpr int GROUPS = VECS / GROUP + (SVECS ? CHUNKS : 0);
    extern __shared__ __align__(128) unsigned staged[];  // THREADS * SVECS vectors of the chunk
    __shared__ __align__(8) unsigned long long landed[CHUNKS];  // mbarriers: bulk copy c is here
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
    // This thread's vector j of bulk copy c, as an index into staged[] (and, past staged_first, into the row).
    auto staged_vec = [](int c, int j) { return int(threadIdx.x) + (c * CHUNK + j) * THREADS; };
    if (SVECS) {
        if (threadIdx.x == 0) {
            for (int c = 0; c < CHUNKS; ++c) mbarrier_init(&landed[c]);
            mbarriers_ready();
            for (int c = 0; c < CHUNKS; ++c) {
                const int start = c * THREADS * CHUNK, n = max(0, min(THREADS * CHUNK, staged_own - start));
                mbarrier_expect(&landed[c], n * 16);
                if (n) bulk_load(staged + 4 * start, xr + 4 * (staged_first + start), n * 16, &landed[c]);
            }
        }
        __syncthreads();  // the mbarriers are set up
    }
    unsigned w[VECS][4];
    bool in_row[VECS];
#pragma unroll
    for (int i = 0; i < VECS; ++i) {
        in_row[i] = first + i * THREADS < n_vec;
        if (in_row[i]) load16(xr + 4 * (first + i * THREADS), w[i]);
    }

    // The running (max m, sum s); x -> exp(x - group_max[g]) in place, group by group as they land.
    float m = NEG_INF, s = 0.0f, group_max[GROUPS];
#pragma unroll
    for (int c = 0; c < (SVECS ? CHUNKS : 0); ++c) {  // the staged vectors: groups VECS / GROUP ...
        unsigned v[CHUNK][4];
        bool in[CHUNK];
        mbarrier_wait(&landed[c], 0);
#pragma unroll
        for (int j = 0; j < CHUNK; ++j) {
            in[j] = staged_vec(c, j) < staged_own;
            if (in[j]) load16_shared(staged + 4 * staged_vec(c, j), v[j]);
        }
        group_max[VECS / GROUP + c] = online_group<CHUNK>(v, in, m, s);
#pragma unroll
        for (int j = 0; j < CHUNK; ++j) {
            if (in[j]) store16_shared(staged + 4 * staged_vec(c, j), v[j]);
        }
    }
#pragma unroll
    for (int i = 0; i < VECS; i += GROUP) group_max[i / GROUP] = online_group<GROUP>(w + i, in_row + i, m, s);
    const float m_thread = m;
    m = block_max(m, max_slots);
    s = block_sum(m_thread == NEG_INF ? 0.0f : s * exp2_approx((m_thread - m) * LOG2E), sum_slots);

    cluster_wait();                               // every block has started
    if (threadIdx.x < CLUSTER) store_pair_to_block(&parts[rank][0], threadIdx.x, m, s);
    cluster_arrive();
    cluster_wait();                               // every block's pair is here
    float row_max = parts[0][0];  // loops not unrolled: 16 blocks' pairs at once would spill registers
#pragma unroll 1
    for (int r = 1; r < CLUSTER; ++r) row_max = fmaxf(row_max, parts[r][0]);
    float row_sum = 0.0f;
#pragma unroll 1
    for (int r = 0; r < CLUSTER; ++r) row_sum += parts[r][1] * exp2_approx((parts[r][0] - row_max) * LOG2E);
    const float inv = 1.0f / row_sum;

    // y = e * exp(group max - row max) / row sum
#pragma unroll
    for (int g = 0; g < VECS / GROUP; ++g) {
        const float scale = exp2_approx((group_max[g] - row_max) * LOG2E) * inv;
#pragma unroll
        for (int i = g * GROUP; i < (g + 1) * GROUP; ++i) {
            if (in_row[i]) scale_store(w[i], yr + 4 * (first + i * THREADS), scale);
        }
    }
#pragma unroll
    for (int c = 0; c < (SVECS ? CHUNKS : 0); ++c) {
        const float scale = exp2_approx((group_max[VECS / GROUP + c] - row_max) * LOG2E) * inv;
#pragma unroll
        for (int j = 0; j < CHUNK; ++j) {
            const int k = staged_vec(c, j);
            if (k < staged_own) {
                unsigned v[4];
                load16_shared(staged + 4 * k, v);
                scale_store(v, yr + 4 * (staged_first + k), scale);
            }
        }
    }
}
