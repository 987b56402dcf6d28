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
// With PREFETCH, the next row's x and dy are loaded while the block waits for this row's sums.
//
// labkit/kernels/layer_norm.py compiles this file at run time with NVRTC, defining ELEM (0 fp32, 1 bf16,
// 2 fp16), CLUSTER (1..16), THREADS (a multiple of 32), VECS and PREFETCH (0 or 1).
#include "cluster.cuh"

__device__ __forceinline__ void load_row(const unsigned* x, const unsigned* dy, int first, int n_vec,
                                         unsigned xw[VECS][4], unsigned dyw[VECS][4]) {
#pragma unroll
    for (int i = 0; i < VECS; ++i) {
        if (first + i * THREADS < n_vec) {
            load16(x + 4 * (first + i * THREADS), xw[i]);
            load16(dy + 4 * (first + i * THREADS), dyw[i]);
        }
    }
}

__device__ __forceinline__ void xhat_and_dy(const unsigned xw[4], const unsigned dyw[4], float mu, float rs,
                                            float xhat[EPV], float g[EPV]) {
    // One 16-byte vector of x and of dy as floats: xhat = (x - mean) * rstd, and dy.
    unpack(xw, xhat);
    unpack(dyw, g);
#pragma unroll
    for (int k = 0; k < EPV; ++k) xhat[k] = (xhat[k] - mu) * rs;
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
    __shared__ float slots[2][2][WARPS];                 // block sums of even / odd steps
    __shared__ __align__(8) float parts[2][CLUSTER][2];  // every block's (a, b), even / odd steps
    __shared__ __align__(8) unsigned long long landed[2];  // mbarriers: the CLUSTER pairs of a step are here

    const int rank = blockIdx.x % CLUSTER, cluster = blockIdx.x / CLUSTER, clusters = gridDim.x / CLUSTER;
    const int first = rank * THREADS * VECS + threadIdx.x;  // vector i of this thread: first + i * THREADS
    float wf[VECS][EPV], dw[VECS][EPV], db[VECS][EPV], f[EPV], g[EPV];
    unsigned xw[VECS][4], dyw[VECS][4];
#pragma unroll
    for (int i = 0; i < VECS; ++i) {
        for (int k = 0; k < EPV; ++k) wf[i][k] = dw[i][k] = db[i][k] = 0.0f;
        if (first + i * THREADS < n_vec) {
            load16(w + 4 * (first + i * THREADS), xw[i]);
            unpack(xw[i], wf[i]);
        }
    }
    if (threadIdx.x == 0) {
        mbarrier_init(&landed[0]);
        mbarrier_init(&landed[1]);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    cluster_arrive();
    cluster_wait();  // every block of the cluster has started and set up its mbarriers

    float mu = 0.0f, rs = 0.0f;
    if (cluster < M) {
        mu = mean[cluster];
        rs = rstd[cluster];
        load_row(x + (long long)cluster * stride_x * 4, dy + (long long)cluster * stride_dy * 4, first, n_vec,
                 xw, dyw);
    }
    int step = 0;
    for (long long row = cluster; row < M; row += clusters, ++step) {
        const int p = step & 1;
        float a = 0.0f, b = 0.0f;
#pragma unroll
        for (int i = 0; i < VECS; ++i) {
            if (first + i * THREADS < n_vec) {
                xhat_and_dy(xw[i], dyw[i], mu, rs, f, g);
                for (int k = 0; k < EPV; ++k) {
                    const float gw = g[k] * wf[i][k];
                    a = fmaf(gw, f[k], a);
                    b += gw;
                }
            }
        }
        block_sum2(a, b, slots[p][0], slots[p][1]);
        if (threadIdx.x == 0) mbarrier_expect(&landed[p], CLUSTER * 8);
        if (threadIdx.x < CLUSTER) send_pair_to_block(&parts[p][rank][0], &landed[p], threadIdx.x, a, b);

        const long long next = row + clusters;
        float next_mu = 0.0f, next_rs = 0.0f;
        unsigned next_xw[VECS][4], next_dyw[VECS][4];
        if (PREFETCH && next < M) {  // the next row's loads fly while this block waits and writes this row
            next_mu = mean[next];
            next_rs = rstd[next];
            load_row(x + next * stride_x * 4, dy + next * stride_dy * 4, first, n_vec, next_xw, next_dyw);
        }
        mbarrier_wait(&landed[p], (step >> 1) & 1);
        a = b = 0.0f;
#pragma unroll
        for (int r = 0; r < CLUSTER; ++r) {
            a += parts[p][r][0];
            b += parts[p][r][1];
        }
        a /= N;
        b /= N;

        unsigned* dxr = dx + row * stride_dx * 4;
#pragma unroll
        for (int i = 0; i < VECS; ++i) {
            if (first + i * THREADS < n_vec) {
                xhat_and_dy(xw[i], dyw[i], mu, rs, f, g);
                for (int k = 0; k < EPV; ++k) {
                    dw[i][k] = fmaf(g[k], f[k], dw[i][k]);
                    db[i][k] += g[k];
                    f[k] = rs * (g[k] * wf[i][k] - fmaf(f[k], a, b));  // dx, over xhat
                }
                pack(f, xw[i]);
                store16(dxr + 4 * (first + i * THREADS), xw[i]);
            }
        }
        if (next < M) {
            if (PREFETCH) {
                mu = next_mu;
                rs = next_rs;
#pragma unroll
                for (int i = 0; i < VECS; ++i)
                    for (int k = 0; k < 4; ++k) {
                        xw[i][k] = next_xw[i][k];
                        dyw[i][k] = next_dyw[i][k];
                    }
            } else {
                mu = mean[next];
                rs = rstd[next];
                load_row(x + next * stride_x * 4, dy + next * stride_dy * 4, first, n_vec, xw, dyw);
            }
        }
    }
#pragma unroll
    for (int i = 0; i < VECS; ++i) {  // this cluster's partial row of dweight and dbias
        const int v = first + i * THREADS;
        if (v < n_vec) {
            for (int k = 0; k < EPV; ++k) {
                dw_part[(long long)cluster * N + v * EPV + k] = dw[i][k];
                db_part[(long long)cluster * N + v * EPV + k] = db[i][k];
            }
        }
    }
    cluster_arrive();
    cluster_wait();  // no block leaves while another may still send to it
}
