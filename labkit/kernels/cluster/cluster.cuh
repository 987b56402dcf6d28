// cluster.cuh: device helpers of labkit's run-time compiled (NVRTC) kernels for Hopper thread-block
// clusters: 16-byte vectors of fp32 / bf16 / fp16 (ELEM 0 / 1 / 2) to floats and back, streaming loads and
// stores, fast exp2 / log2, block reductions, the cluster barrier, stores into another block's shared
// memory (distributed shared memory) and mbarriers. No CUDA headers: NVRTC compiles it as it is.
// The including kernel defines ELEM and THREADS (a multiple of 32) before including it.
#pragma once

#define WARPS (THREADS / 32)
#define EPV (ELEM == 0 ? 4 : 8)  // elements per 16-byte vector
#define LOG2E 1.4426950408889634f
#define NEG_INF (-__int_as_float(0x7f800000))

// ---- one 16-byte vector <-> EPV floats
__device__ __forceinline__ void unpack_f16(unsigned w, float& lo, float& hi) {  // two fp16 -> two floats
    asm("{ .reg .b16 l, h; mov.b32 {l, h}, %2; cvt.f32.f16 %0, l; cvt.f32.f16 %1, h; }" : "=f"(lo), "=f"(hi) : "r"(w));
}

__device__ __forceinline__ unsigned pack_f16(float lo, float hi) {  // two floats -> two fp16, rounded to nearest
    unsigned w;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(w) : "f"(hi), "f"(lo));  // the first operand goes to the upper half
    return w;
}

__device__ __forceinline__ void unpack(const unsigned w[4], float f[EPV]) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
#if ELEM == 0
        f[k] = __uint_as_float(w[k]);
#elif ELEM == 1
        f[2 * k] = __uint_as_float(w[k] << 16);  // bf16 is the top half of an fp32
        f[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
#else
        unpack_f16(w[k], f[2 * k], f[2 * k + 1]);
#endif
    }
}

__device__ __forceinline__ void pack(const float f[EPV], unsigned w[4]) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
#if ELEM == 0
        w[k] = __float_as_uint(f[k]);
#elif ELEM == 1  // the first operand goes to the upper half: element 2k+1
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(w[k]) : "f"(f[2 * k + 1]), "f"(f[2 * k]));
#else
        w[k] = pack_f16(f[2 * k], f[2 * k + 1]);
#endif
    }
}

// ---- memory: x is read once (no L1 allocation), y written once (streaming store)
__device__ __forceinline__ void load16(const unsigned* p, unsigned w[4]) {
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3]) : "l"(p));
}

__device__ __forceinline__ void store16(unsigned* p, const unsigned w[4]) {
    asm volatile("st.global.cs.v4.u32 [%0], {%1, %2, %3, %4};"
                 :: "l"(p), "r"(w[0]), "r"(w[1]), "r"(w[2]), "r"(w[3]) : "memory");
}

__device__ __forceinline__ void store_floats(float* p, const float f[EPV]) {  // EPV floats, 16-byte aligned
#pragma unroll
    for (int k = 0; k < EPV; k += 4)
        asm volatile("st.global.v4.f32 [%0], {%1, %2, %3, %4};"
                     :: "l"(p + k), "f"(f[k]), "f"(f[k + 1]), "f"(f[k + 2]), "f"(f[k + 3]) : "memory");
}

__device__ __forceinline__ float exp2_approx(float v) {
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(v));
    return r;
}

__device__ __forceinline__ float log2_approx(float v) {
    float r;
    asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(v));
    return r;
}

// ---- the cluster: barrier halves and a store into another block's shared memory
__device__ __forceinline__ void cluster_arrive_relaxed() {
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}

__device__ __forceinline__ void cluster_arrive() {  // release: this block's stores before it are seen...
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
}

__device__ __forceinline__ void cluster_wait() {  // ...by every block after its wait (acquire)
    asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}

__device__ __forceinline__ unsigned smem32(const void* p) {  // a __shared__ pointer as a 32-bit address
    unsigned a;
    asm("{ .reg .u64 g; cvta.to.shared.u64 g, %1; cvt.u32.u64 %0, g; }" : "=r"(a) : "l"(p));
    return a;
}

__device__ __forceinline__ unsigned in_block(const void* local, unsigned rank) {
    // The address of the same __shared__ variable in block `rank` of the cluster.
    unsigned addr;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(addr) : "r"(smem32(local)), "r"(rank));
    return addr;
}

__device__ __forceinline__ void store_pair_to_block(float* local, unsigned rank, float a, float b) {
    // `local` is a __shared__ address of this block; the same variable in block `rank` gets (a, b).
    asm volatile("st.shared::cluster.v2.f32 [%0], {%1, %2};" :: "r"(in_block(local, rank)), "f"(a), "f"(b)
                 : "memory");
}

// ---- mbarriers: a phase completes when its one arrival and the bytes it expects have come
__device__ __forceinline__ void mbarrier_init(unsigned long long* bar) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(smem32(bar)) : "memory");
}

__device__ __forceinline__ void mbarriers_ready() {  // after the inits: the cluster's threads and copies see them
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

__device__ __forceinline__ void mbarrier_expect(unsigned long long* bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(smem32(bar)), "r"(bytes)
                 : "memory");
}

__device__ __forceinline__ void mbarrier_wait(unsigned long long* bar, unsigned parity) {
    asm volatile("{ .reg .pred done; WAIT: mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;"
                 " @!done bra WAIT; }" :: "r"(smem32(bar)), "r"(parity) : "memory");
}

__device__ __forceinline__ void send_pair_to_block(float* local, unsigned long long* bar, unsigned rank,
                                                   float a, float b) {
    // (a, b) into `local` of block `rank`, counted (8 bytes) by that block's mbarrier `bar`: an asynchronous
    // store that needs no fence, so it does not wait for this thread's earlier stores to global memory.
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.f32 [%0], {%1, %2}, [%3];"
                 :: "r"(in_block(local, rank)), "f"(a), "f"(b), "r"(in_block(bar, rank)) : "memory");
}

// ---- bulk copies from global into this block's shared memory, counted (bytes) by an mbarrier
__device__ __forceinline__ void bulk_load(void* dst, const void* src, unsigned bytes, unsigned long long* bar) {
    // One thread copies `bytes` (a multiple of 16; both addresses 16-byte aligned); `bar` must expect them.
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 :: "r"(smem32(dst)), "l"(src), "r"(bytes), "r"(smem32(bar)) : "memory");
}

__device__ __forceinline__ void load16_shared(const unsigned* p, unsigned w[4]) {
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3]) : "r"(smem32(p)));
}

__device__ __forceinline__ void store16_shared(unsigned* p, const unsigned w[4]) {
    asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};"
                 :: "r"(smem32(p)), "r"(w[0]), "r"(w[1]), "r"(w[2]), "r"(w[3]) : "memory");
}

__device__ __forceinline__ void reads_before_copies() {
    // This thread's (and, after a barrier, its block's) reads of shared memory come before the bulk copies it
    // issues next into the same bytes (ordinary and asynchronous accesses are ordered only by this fence).
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// ---- block reductions: warp shuffles, then one slot per warp in shared memory
__device__ __forceinline__ float block_max(float v, float* slots) {
    for (int o = 16; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    if (threadIdx.x % 32 == 0) slots[threadIdx.x / 32] = v;
    __syncthreads();
    v = threadIdx.x % 32 < WARPS ? slots[threadIdx.x % 32] : NEG_INF;
    for (int o = 16; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;  // in every thread
}

__device__ __forceinline__ void block_sum2(float& a, float& b, float* slots_a, float* slots_b) {
    // a and b summed over the block, in every thread (one barrier for both)
    for (int o = 16; o > 0; o /= 2) {
        a += __shfl_xor_sync(0xffffffffu, a, o);
        b += __shfl_xor_sync(0xffffffffu, b, o);
    }
    if (threadIdx.x % 32 == 0) {
        slots_a[threadIdx.x / 32] = a;
        slots_b[threadIdx.x / 32] = b;
    }
    __syncthreads();
    a = threadIdx.x % 32 < WARPS ? slots_a[threadIdx.x % 32] : 0.0f;
    b = threadIdx.x % 32 < WARPS ? slots_b[threadIdx.x % 32] : 0.0f;
    for (int o = 16; o > 0; o /= 2) {
        a += __shfl_xor_sync(0xffffffffu, a, o);
        b += __shfl_xor_sync(0xffffffffu, b, o);
    }
}

__device__ __forceinline__ float block_sum(float v, float* slots) {
    for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (threadIdx.x % 32 == 0) slots[threadIdx.x / 32] = v;
    __syncthreads();
    v = threadIdx.x % 32 < WARPS ? slots[threadIdx.x % 32] : 0.0f;
    for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
