// layer_norm_bwd_cluster.cu: layer norm's backward for long rows on Hopper (sm_90), rows shared by the
// blocks of a thread-block cluster.
//
// Bytes: read x and dy, write dx (3 * rows * cols * element size; weight, mean and rstd are small).
// With xhat = (x - mean) * rstd and g = dy * weight, each row needs two sums over the whole row,
// a = sum(g * xhat) and b = sum(g), before dx = rstd * (g - (xhat * a + b) / cols).
// A row is shared by the CLUSTER blocks of a cluster, block `rank` owning the rank-th chunk of columns
// (VECS 16-byte vectors per thread). Each block sends its (a, b) into every block's shared memory with
// an asynchronous store counted by that block's mbarrier, so no block waits for a fence. The clusters
// stay resident and walk the rows, so each block adds up dweight = sum(dy * xhat) and dbias = sum(dy) of
// its columns in registers and writes one partial row per cluster at the end (added up by sum_partials).
// Rows arrive by bulk copies (cp.async.bulk) into a ring of STAGES stages of shared memory, so several rows
// are in flight while the block works; holding the next row in registers instead kept one row in flight
// (bf16 4096x16384 on an H200: 62% of copy bandwidth, against 85% so).
//
// labkit/kernels/layer_norm.py compiles this file at run time with NVRTC, defining ELEM (0 fp32, 1 bf16,
// 2 fp16), CLUSTER (1..16), THREADS (a multiple of 32), VECS and STAGES, and launches it with
// STAGES * 2 * THREADS * VECS * 16 bytes of dynamic shared memory.
#include "cluster.cuh"

#define CHUNK (THREADS * VECS)  // 16-byte vectors of a row per block (x's, then dy's in a stage)
#define STAGE_WORDS (8 * CHUNK)  // 32-bit words of a stage: two chunks of 4-word vectors

__device__ __forceinline__ void fetch_row(unsigned* stage, const unsigned* x, const unsigned* dy, unsigned bytes,
                                          unsigned long long* full) {
    // One thread: this block's chunk of a row of x and of dy into `stage`, counted by the mbarrier `full`.
    mbarrier_expect(full, 2 * bytes);
    if (bytes) {
        bulk_load(stage, x, bytes, full);
        bulk_load(stage + 4 * CHUNK, dy, bytes, full);
    }
}

extern "C" __global__ void __cluster_dims__(CLUSTER, 1, 1) __launch_bounds__(THREADS)
layer_norm_bwd_cluster(const unsigned* __restrict__ dy,   // rows of dy, as 32-bit words (16-byte aligned)
                       const unsigned* __restrict__ x,    // rows of x, same dtype
                       const unsigned* __restrict__ w,    // weight (cols,), same dtype
                       const float* __restrict__ mean,    // (rows,) fp32, from the forward
                       const float* __restrict__ rstd,    // (rows,) fp32, from the forward
                       unsigned* __restrict__ dx,         // rows of dx, same dtype
                       float* __restrict__ dw_part,       // (clusters, cols) fp32 partial sums of dweight
                       float* __restrict__ db_part,       // (clusters, cols) fp32 partial sums of dbias
                       int M, int N,                      // rows, cols
                       int n_vec,                         // 16-byte vectors per row (cols / EPV)
                       int stride_dy, int stride_x, int stride_dx) {  // row strides, in 16-byte vectors
    extern __shared__ __align__(128) unsigned ring[];    // STAGES stages: a chunk of x, then of dy
    __shared__ float slots[2][2][WARPS];                 // block sums of even / odd steps
    __shared__ __align__(8) float parts[2][CLUSTER][2];  // every block's (a, b), even / odd steps
    __shared__ __align__(8) unsigned long long landed[2];  // mbarriers: the CLUSTER pairs of a step are here
    __shared__ __align__(8) unsigned long long full[STAGES];  // mbarriers: a stage's row is here

    const int rank = blockIdx.x % CLUSTER, cluster = blockIdx.x / CLUSTER, clusters = gridDim.x / CLUSTER;
    const int base = rank * CHUNK;                       // this block's first vector of a row
    const int own = max(0, min(CHUNK, n_vec - base));    // and how many it owns (0: past the row's end)
    const unsigned bytes = own * 16;
    if (threadIdx.x == 0) {  // set up the mbarriers and start the first STAGES rows
        mbarrier_init(&landed[0]);
        mbarrier_init(&landed[1]);
        for (int s = 0; s < STAGES; ++s) mbarrier_init(&full[s]);
        mbarriers_ready();
        for (int s = 0; s < STAGES; ++s) {
            const long long row = cluster + (long long)s * clusters;
            if (row < M)
                fetch_row(ring + s * STAGE_WORDS, x + (row * stride_x + base) * 4, dy + (row * stride_dy + base) * 4,
                          bytes, &full[s]);
        }
    }
    float wf[VECS][EPV], dw[VECS][EPV], db[VECS][EPV], xhat[VECS][EPV], gw[VECS][EPV], f[EPV];
    unsigned xw[VECS][4], dyw[VECS][4];
#pragma unroll
    for (int i = 0; i < VECS; ++i) {
        for (int k = 0; k < EPV; ++k) wf[i][k] = dw[i][k] = db[i][k] = 0.0f;
        if (threadIdx.x + i * THREADS < own) {
            load16(w + 4 * (base + threadIdx.x + i * THREADS), xw[i]);
            unpack(xw[i], wf[i]);
        }
    }
    __syncthreads();
    cluster_arrive();
    cluster_wait();  // every block of the cluster has started and set up its mbarriers

    float mu = 0.0f, rs = 0.0f;
    if (cluster < M) {
        mu = mean[cluster];
        rs = rstd[cluster];
    }
    int step = 0;
    for (long long row = cluster; row < M; row += clusters, ++step) {
        const int p = step & 1, s = step % STAGES;
        const long long next = row + clusters;
        float next_mu = 0.0f, next_rs = 0.0f;
        if (next < M) {  // in flight while this row is worked on
            next_mu = mean[next];
            next_rs = rstd[next];
        }
        mbarrier_wait(&full[s], (step / STAGES) & 1);
        const unsigned* stage = ring + s * STAGE_WORDS;
        float a = 0.0f, b = 0.0f;
#pragma unroll
        for (int i = 0; i < VECS; ++i) {  // xhat and g * weight kept as floats for dx; dweight and dbias added
            if (threadIdx.x + i * THREADS < own) {
                load16_shared(stage + 4 * (threadIdx.x + i * THREADS), xw[i]);
                load16_shared(stage + 4 * CHUNK + 4 * (threadIdx.x + i * THREADS), dyw[i]);
                unpack(xw[i], xhat[i]);
                unpack(dyw[i], f);  // dy
                for (int k = 0; k < EPV; ++k) {
                    xhat[i][k] = (xhat[i][k] - mu) * rs;
                    gw[i][k] = f[k] * wf[i][k];
                    a = fmaf(gw[i][k], xhat[i][k], a);
                    b += gw[i][k];
                    dw[i][k] = fmaf(f[k], xhat[i][k], dw[i][k]);
                    db[i][k] += f[k];
                }
            }
        }
        block_sum2(a, b, slots[p][0], slots[p][1]);  // its barrier: every thread has read stage s
        if (threadIdx.x == 0) {
            mbarrier_expect(&landed[p], CLUSTER * 8);
            const long long refill = row + (long long)STAGES * clusters;
            if (refill < M) {
                reads_before_copies();
                fetch_row(ring + s * STAGE_WORDS, x + (refill * stride_x + base) * 4,
                          dy + (refill * stride_dy + base) * 4, bytes, &full[s]);
            }
        }
        if (threadIdx.x < CLUSTER) send_pair_to_block(&parts[p][rank][0], &landed[p], threadIdx.x, a, b);
        mbarrier_wait(&landed[p], (step >> 1) & 1);
        a = b = 0.0f;
#pragma unroll
        for (int r = 0; r < CLUSTER; ++r) {
            a += parts[p][r][0];
            b += parts[p][r][1];
        }
        const float ra = a * rs / N, rb = b * rs / N;  // dx = rstd * g * weight - xhat * ra - rb

        unsigned* dxr = dx + row * stride_dx * 4;
#pragma unroll
        for (int i = 0; i < VECS; ++i) {
            if (threadIdx.x + i * THREADS < own) {
                for (int k = 0; k < EPV; ++k) f[k] = fmaf(-xhat[i][k], ra, fmaf(gw[i][k], rs, -rb));
                pack(f, xw[i]);
                store16(dxr + 4 * (base + threadIdx.x + i * THREADS), xw[i]);
            }
        }
        mu = next_mu;
        rs = next_rs;
    }
    // This cluster's partial row of dweight and dbias, in 16-byte stores: 4-byte stores to every other 32-byte
    // sector were 13-26 us of a 125 us kernel (bf16 4096x16384, H200), bound by the L2's store transactions.
#pragma unroll
    for (int i = 0; i < VECS; ++i) {
        if (threadIdx.x + i * THREADS < own) {
            const long long at = (long long)cluster * N + (base + threadIdx.x + i * THREADS) * EPV;
            store_floats(dw_part + at, dw[i]);
            store_floats(db_part + at, db[i]);
        }
    }
    cluster_arrive();
    cluster_wait();  // no block leaves while another may still send to it
}
