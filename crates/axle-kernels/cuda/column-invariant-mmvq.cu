// Axle's column-invariant quantized products, appended to ggml's ggml-cuda/mmvq.cu by
// scripts/build-backend.sh (so that it sees that file's vec-dot table), with a hook in
// ggml_cuda_mul_mat (both by crates/axle-kernels/cuda/apply.py). Written for Axle; not part of ggml.
//
// What it is for. ggml's mat-vec kernel (MMVQ) sums a row of a one-column product with 4 warps
// on NVIDIA's generic parameter table (Ampere, Ada, Hopper): thread t of the block takes the
// weight blocks t/(qi/vdr), t/(qi/vdr) + vdr*128/qi, ... in that order, warps 1-3 hand their
// partial sums to warp 0 through shared memory, warp 0 adds them in warp order and a butterfly
// reduction finishes the row. At 5-8 columns it takes 2 warps and from 9 columns the tiled MMQ
// kernel, so a column's bits depend on how many columns share the op: the reason Axle's device
// layout multiplies a batch's decode columns in groups of 4, one pass over the weights per group.
//
// This kernel gives every column of a product of any width exactly the arithmetic of the
// one-column kernel (the same thread-to-block assignment, the same vec-dot function, the same
// order of partial sums), for up to 8 columns per block (the default shape), so a column's
// result is the same bit for bit alone or beside 63 others, and the weights are read once per 8
// columns instead of once per 4. Axle asks for it per product with the mul_mat hint
// AXLE_HINT_COLUMN_INVARIANT (op_params[1]); nothing else changes, so libllama and llama.cpp's
// tools built from the same source run exactly as without it. `axle bench device-check` checks
// the bits (batched against alone, speculation on against off) on each device it runs on.

#define AXLE_HINT_COLUMN_INVARIANT 0x41584c31 // "AXL1"
#define AXLE_CI_WARPS 4 // ggml's MMVQ at 1-4 columns on the generic parameter table

// Whether Axle's kernels are launched with programmatic dependent launch (declared in mmvq.cuh
// with axle_launch, which both kernel files use): where ggml would use it (Hopper and newer,
// GGML_CUDA_PDL not 0), so that the kernel's launch overlaps the end of the one before it, as
// ggml's own kernels' launches do. AXLE_PDL=0 launches them plainly (for measurements). Each of
// these kernels waits for the previous kernel (ggml_cuda_pdl_sync) before it touches global
// memory, so either way it reads complete inputs.
bool ggml_cuda_axle_pdl() {
    static const bool pdl = [] {
        const char * env = getenv("AXLE_PDL");
        return env == nullptr || strcmp(env, "0") != 0;
    }();
    return pdl;
}

static constexpr bool axle_ci_type(ggml_type type) {
    switch (type) {
        case GGML_TYPE_Q4_0:
        case GGML_TYPE_Q4_1:
        case GGML_TYPE_Q5_0:
        case GGML_TYPE_Q5_1:
        case GGML_TYPE_Q8_0:
        case GGML_TYPE_MXFP4:
        case GGML_TYPE_Q2_K:
        case GGML_TYPE_Q3_K:
        case GGML_TYPE_Q4_K:
        case GGML_TYPE_Q5_K:
        case GGML_TYPE_Q6_K:
        case GGML_TYPE_IQ4_NL:
        case GGML_TYPE_IQ4_XS:
            return true;
        default:
            return false;
    }
}

// The end of a one-column MMVQ row, for `cols` by `rows` sums a thread: warps 1..3 hand over their
// partial sums, warp 0 adds them in warp order, then reduces across its lanes (warp_reduce_sum).
template <int cols, int rows>
static __device__ __forceinline__ void axle_ci_finish(
        float (&sum)[cols][rows], float * __restrict__ dst, const int row0, const int col0,
        const int ncols, const int nrows_x, const int stride_col_dst) {
    __shared__ float handed[AXLE_CI_WARPS - 1][cols][rows][WARP_SIZE];
    if (threadIdx.y > 0) {
#pragma unroll
        for (int j = 0; j < cols; ++j) {
#pragma unroll
            for (int i = 0; i < rows; ++i) {
                handed[threadIdx.y - 1][j][i][threadIdx.x] = sum[j][i];
            }
        }
    }
    __syncthreads();
    if (threadIdx.y > 0) {
        return;
    }
#pragma unroll
    for (int j = 0; j < cols; ++j) {
#pragma unroll
        for (int i = 0; i < rows; ++i) {
#pragma unroll
            for (int w = 0; w < AXLE_CI_WARPS - 1; ++w) {
                sum[j][i] += handed[w][j][i][threadIdx.x];
            }
            sum[j][i] = warp_reduce_sum<WARP_SIZE>(sum[j][i]);
            if (threadIdx.x == i && j < ncols && row0 + i < nrows_x) {
                dst[(int64_t) (col0 + j)*stride_col_dst + row0 + i] = sum[j][i];
            }
        }
    }
}

// One block: `rows` output rows times up to `cols` columns (blockIdx.y picks the columns), with at
// least `min_blocks` blocks resident per SM (a register cap). None of them changes a row's
// arithmetic: they trade registers and occupancy against loads of the columns and weights.
template <ggml_type type, int cols, int rows, int min_blocks>
__launch_bounds__(AXLE_CI_WARPS*WARP_SIZE, min_blocks)
static __global__ void axle_ci_mul_mat_vec_q(
        const void * __restrict__ vx, const block_q8_1 * __restrict__ vy, float * __restrict__ dst,
        const int blocks_per_row_x, const int nrows_x, const int stride_row_x,
        const int stride_col_y, const int stride_col_dst, const int ncols_y) {
    // Programmatic dependent launch (Hopper): the next kernel may be launched now and waits for
    // this one's results itself; this one waits here for the previous kernel's, before it reads
    // or writes any global memory.
    ggml_cuda_pdl_lc();
    ggml_cuda_pdl_sync();
    constexpr int qk  = ggml_cuda_type_traits<type>::qk;
    constexpr int qi  = ggml_cuda_type_traits<type>::qi;
    constexpr int vdr = get_vdr_mmvq(type);
    constexpr vec_dot_q_cuda_t vec_dot = get_vec_dot_q_cuda(type);
    constexpr int step = vdr*AXLE_CI_WARPS*WARP_SIZE/qi; // weight blocks a pass of the block covers

    const int tid   = WARP_SIZE*threadIdx.y + threadIdx.x;
    const int row0  = rows*blockIdx.x;
    const int col0  = cols*blockIdx.y;
    const int ncols = min(cols, ncols_y - col0);
    const block_q8_1 * y = vy + (int64_t) col0*stride_col_y;

    // Rows past the end (an odd row count) read the last row and are not written.
    int row_base[rows];
#pragma unroll
    for (int i = 0; i < rows; ++i) {
        row_base[i] = min(row0 + i, nrows_x - 1)*stride_row_x;
    }

    // Columns past the end (the last block's) repeat the last column and are not written: no
    // branch in the loop, so that each weight block is loaded once for all columns.
    int col_base[cols];
#pragma unroll
    for (int j = 0; j < cols; ++j) {
        col_base[j] = min(j, ncols - 1)*stride_col_y;
    }

    float sum[cols][rows] = {{0.0f}};
    for (int kbx = tid/(qi/vdr); kbx < blocks_per_row_x; kbx += step) {
        const int kby = kbx*(qk/QK8_1);
        const int kqs = vdr*(tid % (qi/vdr));
#pragma unroll
        for (int j = 0; j < cols; ++j) {
#pragma unroll
            for (int i = 0; i < rows; ++i) {
                sum[j][i] += vec_dot(vx, &y[col_base[j] + kby], row_base[i] + kbx, kqs);
            }
        }
    }

    axle_ci_finish<cols, rows>(sum, dst, row0, col0, ncols, nrows_x, stride_col_dst);
}

// The same kernel for Q6_K weights (an 8B model's output head), with the next pass's weights
// asked into L2 while this pass is multiplied. The generic loop issues a pass's loads and then
// waits for them: a thread makes only 4 passes over a 4096-weight row (16 blocks, 4 warps), so
// each pass waits out a memory latency with nothing to hide it, and the head ran at about a
// quarter of the memory's speed. Loading the next pass's weights into registers ahead did not
// work out: the compiler put those loads after the products whatever the registers allowed. A
// prefetch into L2 needs no registers. A thread's arithmetic is ggml's vec_dot_q6_K_q8_1 for
// iqs = its lane: the same loads and the same call of vec_dot_q6_K_q8_1_impl_mmvq, added to the
// same sums in the same order; each row has a pointer advanced by a constant.
template <int cols, int rows, int min_blocks>
__launch_bounds__(AXLE_CI_WARPS*WARP_SIZE, min_blocks)
static __global__ void axle_ci_mul_mat_vec_q6_K(
        const void * __restrict__ vx, const block_q8_1 * __restrict__ vy, float * __restrict__ dst,
        const int blocks_per_row_x, const int nrows_x, const int stride_row_x,
        const int stride_col_y, const int stride_col_dst, const int ncols_y) {
    ggml_cuda_pdl_lc(); // as in axle_ci_mul_mat_vec_q
    ggml_cuda_pdl_sync();
    static_assert(get_vdr_mmvq(GGML_TYPE_Q6_K) == 1 && QI6_K == WARP_SIZE, "one Q6_K block per warp pass");
    static_assert(sizeof(block_q6_K) <= 256, "a block in the two 128-byte lines after its start");
    constexpr int step = AXLE_CI_WARPS; // weight blocks a pass of the block covers

    const int iqs   = threadIdx.x; // vdr*(tid % (qi/vdr)) with vdr = 1, qi = 32
    const int kbx0  = threadIdx.y; // tid/(qi/vdr)
    const int row0  = rows*blockIdx.x;
    const int col0  = cols*blockIdx.y;
    const int ncols = min(cols, ncols_y - col0);

    // vec_dot_q6_K_q8_1's offsets for this iqs.
    const int bq8_offset   = 2*QR6_K*(iqs/(QI6_K/2)) + (iqs % (QI6_K/2))/(QI6_K/4);
    const int scale_offset = (QI6_K/4)*(iqs/(QI6_K/2)) + (iqs % (QI6_K/2))/(QI6_K/8);
    const int vh_shift     = 2*((iqs % (QI6_K/2))/(QI6_K/4));
    const int qh_index     = (QI6_K/4)*(iqs/(QI6_K/2)) + iqs % (QI6_K/4);
    // Lanes 0-2 of a row prefetch the (up to three) 128-byte lines its next block touches.
    const int prefetch_offset = 128*min(iqs, 2);

    // Rows past the end read the last row, columns past the end the last column; neither is written.
    const block_q6_K * x[rows];
#pragma unroll
    for (int i = 0; i < rows; ++i) {
        x[i] = (const block_q6_K *) vx + (int64_t) min(row0 + i, nrows_x - 1)*stride_row_x + kbx0;
    }
    // The columns as offsets (in q8_1 blocks) from one pointer, which holds fewer registers.
    const block_q8_1 * y = vy + (int64_t) col0*stride_col_y + kbx0*(QK_K/QK8_1) + bq8_offset;
    int col_base[cols];
#pragma unroll
    for (int j = 0; j < cols; ++j) {
        col_base[j] = min(j, ncols - 1)*stride_col_y;
    }

    float sum[cols][rows] = {{0.0f}};
    for (int kbx = kbx0; kbx < blocks_per_row_x; kbx += step) {
        if (iqs < 3 && kbx + step < blocks_per_row_x) {
#pragma unroll
            for (int i = 0; i < rows; ++i) {
                asm volatile("prefetch.global.L2 [%0];" : : "l"((const char *) (x[i] + step) + prefetch_offset));
            }
        }
        int   vl[rows];
        int   vh[rows];
        float d[rows];
        const int8_t * scales[rows];
#pragma unroll
        for (int i = 0; i < rows; ++i) {
            vl[i]     = get_int_b2(x[i]->ql, iqs);
            vh[i]     = get_int_b2(x[i]->qh, qh_index) >> vh_shift;
            d[i]      = x[i]->d;
            scales[i] = x[i]->scales + scale_offset;
            x[i] += step;
        }
#pragma unroll
        for (int j = 0; j < cols; ++j) {
            int   u[QR6_K];
            float d8[QR6_K];
#pragma unroll
            for (int k = 0; k < QR6_K; ++k) {
                u[k]  = get_int_b4(y[col_base[j] + 2*k].qs, iqs % QI8_1);
                d8[k] = __low2float(y[col_base[j] + 2*k].ds);
            }
#pragma unroll
            for (int i = 0; i < rows; ++i) {
                sum[j][i] += vec_dot_q6_K_q8_1_impl_mmvq(vl[i], vh[i], u, scales[i], d[i], d8);
            }
        }
        y += step*(QK_K/QK8_1);
    }

    axle_ci_finish<cols, rows>(sum, dst, row0, col0, ncols, nrows_x, stride_col_dst);
}

// Whether Q6_K weights take their own kernel (the same bits; AXLE_CI_Q6K=0 keeps the generic one,
// for measurements).
static bool axle_ci_q6_K_enabled() {
    static const bool enabled = [] {
        const char * env = getenv("AXLE_CI_Q6K");
        return env == nullptr || strcmp(env, "0") != 0;
    }();
    return enabled;
}

// Tensor-core variant for Q4_0 weights. In the one-column kernel a thread's share of a Q4_0
// block is 16 weights (half a block): it sums their products with the column as integers (dp4a),
// then adds d4*(sumi*d8 - 4*s8) to its float sum. The integer sum is exact in any order, so an
// int8 tensor-core product (mma m16n8k16) gives it for 16 rows by 8 columns at once; the float
// part then replays the one-column kernel step for step. Its thread t (0..127) takes the
// 16-weight chunks t, t + 128, t + 256, ... of a row (chunk c: block c/2, half c%2) in that order;
// warp 0's lane l adds the other warps' sums in warp order, ((a_l + a_{32+l}) + a_{64+l}) +
// a_{96+l}, and a butterfly over the 32 lanes finishes the row.
//
// Here a block of 16 warps takes 16 rows by 8*ntiles columns and walks the row in slabs of 128
// chunks (64 weight blocks), so that each of the 128 threads it replays gets one chunk of each
// slab, in order. The slabs of weights and columns are copied to shared memory ahead of use
// (cp.async, two buffers). Warp v replays the lanes l = v and v + 16, each with its four threads
// t = l + 32*m, and keeps their sums in registers; at the end each lane's sum goes to shared
// memory and one thread per output adds the 32 lane sums in the butterfly's order. Rows must be a
// whole number of slabs (2048 weights) with 16-byte aligned rows; other products take the dp4a
// kernel above, which gives the same bits. Needs Ampere or newer (cp.async, int8 m16n8k16).
#define AXLE_CI_MMA_WARPS 16
#define AXLE_CI_SLAB_BLOCKS 64                                 // Q4_0 blocks per slab = 128 chunks
#define AXLE_CI_SLAB_X (AXLE_CI_SLAB_BLOCKS*18 + 16)           // bytes per row, padded against bank conflicts
#define AXLE_CI_SLAB_Y (AXLE_CI_SLAB_BLOCKS*36 + 16)           // bytes per column
#define AXLE_CI_SLAB_S (AXLE_CI_SLAB_BLOCKS*8 + 16)            // bytes per column of scales

// The column side of the float step, d8 and -4*s8 per q8_1 block, as floats (both exact:
// half to float, and a product by a power of two), so that a column's chunk needs one load.
static __global__ void axle_ci_q8_1_scales(
        const block_q8_1 * __restrict__ vy, float2 * __restrict__ scales, const int n) {
    ggml_cuda_pdl_lc(); // as in axle_ci_mul_mat_vec_q
    ggml_cuda_pdl_sync();
    const int i = blockIdx.x*blockDim.x + threadIdx.x;
    if (i < n) {
        const float2 ds = __half22float2(vy[i].ds);
        scales[i] = make_float2(ds.x, -4.0f*ds.y);
    }
}

template <int ntiles>
static constexpr __host__ __device__ int axle_ci_mma_stage_bytes() {
    return 16*AXLE_CI_SLAB_X + 8*ntiles*(AXLE_CI_SLAB_Y + AXLE_CI_SLAB_S);
}

template <int ntiles>
static constexpr __host__ __device__ int axle_ci_mma_shared_bytes() {
    return 2*axle_ci_mma_stage_bytes<ntiles>() + ntiles*128*(WARP_SIZE + 1)*4; // two stages, the lane sums
}

static __device__ __forceinline__ void axle_ci_copy_16(char * dst, const char * src) {
#ifdef AMPERE_MMA_AVAILABLE
    const unsigned int d = (unsigned int) __cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" : : "r"(d), "l"(src));
#else
    GGML_UNUSED_VARS(dst, src);
    NO_DEVICE_CODE;
#endif // AMPERE_MMA_AVAILABLE
}

template <int ntiles>
__launch_bounds__(AXLE_CI_MMA_WARPS*WARP_SIZE, 1)
static __global__ void axle_ci_mma_q4_0(
        const char * __restrict__ vx, const char * __restrict__ vy, const char * __restrict__ scales,
        float * __restrict__ dst, const int blocks_per_row_x, const int nrows_x, const int stride_row_x,
        const int stride_col_y, const int stride_col_dst, const int ncols_y) {
#ifdef AMPERE_MMA_AVAILABLE
    ggml_cuda_pdl_lc(); // as in axle_ci_mul_mat_vec_q
    ggml_cuda_pdl_sync();
    constexpr int cols = 8*ntiles;
    const int col_tiles = (ncols_y + cols - 1)/cols;
    const int nwork = col_tiles*((nrows_x + 15)/16); // tiles of 16 rows by `cols` columns
    constexpr int stage_bytes = axle_ci_mma_stage_bytes<ntiles>();
    extern __shared__ __align__(16) char axle_ci_smem[];
    const int tid = WARP_SIZE*threadIdx.y + threadIdx.x;
    const int lane = threadIdx.x;
    const int g = lane/4; // fragment row of A and C, column of B
    const int q = lane%4; // which 4 of a chunk's 16 weights (A, B), which 2 columns (C)
    const int nslabs = blocks_per_row_x/AXLE_CI_SLAB_BLOCKS;

    // The block takes the tiles blockIdx.x, blockIdx.x + gridDim.x, ... (columns vary fastest, so
    // that blocks running together share rows) as one stream of slabs: the next slab, of the same
    // tile or the next one, is copied while the current one is used.
    const int nmine = (nwork - (int) blockIdx.x + (int) gridDim.x - 1)/(int) gridDim.x;
    const int nsteps = nmine*nslabs;

    // Copies slab i of tile w into stage buffer b: 16 rows of weights, the columns' q8_1 blocks
    // and their scales. Rows and columns past the end copy the last one (computed, not written).
    auto copy_slab = [&](const int w, const int i, const int b) {
        const int col0 = cols*(w % col_tiles);
        const int row0 = 16*(w / col_tiles);
        char * stage = axle_ci_smem + b*stage_bytes;
        char * sx = stage;
        char * sy = sx + 16*AXLE_CI_SLAB_X;
        char * ss = sy + cols*AXLE_CI_SLAB_Y;
        constexpr int px = AXLE_CI_SLAB_BLOCKS*18/16; // 16-byte pieces per row
        constexpr int py = AXLE_CI_SLAB_BLOCKS*36/16;
        constexpr int ps = AXLE_CI_SLAB_BLOCKS*8/16;
        for (int k = tid; k < 16*px; k += AXLE_CI_MMA_WARPS*WARP_SIZE) {
            const int r = k/px;
            const int64_t row = min(row0 + r, nrows_x - 1);
            axle_ci_copy_16(sx + r*AXLE_CI_SLAB_X + 16*(k % px),
                vx + (row*stride_row_x + (int64_t) i*AXLE_CI_SLAB_BLOCKS)*18 + 16*(k % px));
        }
        for (int k = tid; k < cols*py; k += AXLE_CI_MMA_WARPS*WARP_SIZE) {
            const int c = k/py;
            const int64_t col = min(col0 + c, ncols_y - 1);
            axle_ci_copy_16(sy + c*AXLE_CI_SLAB_Y + 16*(k % py),
                vy + (col*stride_col_y + (int64_t) i*AXLE_CI_SLAB_BLOCKS)*36 + 16*(k % py));
        }
        for (int k = tid; k < cols*ps; k += AXLE_CI_MMA_WARPS*WARP_SIZE) {
            const int c = k/ps;
            const int64_t col = min(col0 + c, ncols_y - 1);
            axle_ci_copy_16(ss + c*AXLE_CI_SLAB_S + 16*(k % ps),
                scales + (col*stride_col_y + (int64_t) i*AXLE_CI_SLAB_BLOCKS)*8 + 16*(k % ps));
        }
        asm volatile("cp.async.commit_group;");
    };

    // The 16 weights of a chunk as mma's k = 0..15: the low nibbles of the half block's two ints,
    // then their high nibbles; the column's q8_1 ints at the same positions (0, 1, 4, 5, plus 2
    // for the second half).
    const int shift = 4*(q >> 1);
    const int xi = q & 1;
    const int yi = (q & 1) + 4*(q >> 1);

    float (*lane_sums)[WARP_SIZE + 1] = (float (*)[WARP_SIZE + 1]) (axle_ci_smem + 2*stage_bytes);
    float acc[2][4][ntiles][4] = {{{{0.0f}}}}; // threads l + 32*m of lanes l = v, v + 16
    copy_slab(blockIdx.x, 0, 0);
    for (int step = 0; step < nsteps; ++step) {
        if (step + 1 < nsteps) {
            copy_slab(blockIdx.x + ((step + 1)/nslabs)*gridDim.x, (step + 1) % nslabs, (step + 1) & 1);
            asm volatile("cp.async.wait_group 1;");
        } else {
            asm volatile("cp.async.wait_group 0;");
        }
        __syncthreads();
        const char * sx = axle_ci_smem + (step & 1)*stage_bytes;
        const char * sy = sx + 16*AXLE_CI_SLAB_X;
        const char * ss = sy + cols*AXLE_CI_SLAB_Y;
#pragma unroll
        for (int lj = 0; lj < 2; ++lj) {
#pragma unroll
            for (int m = 0; m < 4; ++m) {
                const int kc = threadIdx.y + AXLE_CI_MMA_WARPS*lj + WARP_SIZE*m; // chunk in the slab
                const int kb = kc >> 1;
                const int h = kc & 1;
                const char * xa = sx + g*AXLE_CI_SLAB_X + kb*18;
                const char * xb = xa + 8*AXLE_CI_SLAB_X;
                const int a0 = (get_int_b2(xa + 2, 2*h + xi) >> shift) & 0x0F0F0F0F;
                const int a1 = (get_int_b2(xb + 2, 2*h + xi) >> shift) & 0x0F0F0F0F;
                const float da = __half2float(*(const half *) xa);
                const float db = __half2float(*(const half *) xb);
#pragma unroll
                for (int n = 0; n < ntiles; ++n) {
                    const int b = get_int_b4(sy + (8*n + g)*AXLE_CI_SLAB_Y + kb*36 + 4, 2*h + yi);
                    const float2 s0 = *(const float2 *) (ss + (8*n + 2*q + 0)*AXLE_CI_SLAB_S + kb*8);
                    const float2 s1 = *(const float2 *) (ss + (8*n + 2*q + 1)*AXLE_CI_SLAB_S + kb*8);
                    int c0, c1, c2, c3;
                    asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%7, %7, %7, %7};"
                        : "=r"(c0), "=r"(c1), "=r"(c2), "=r"(c3) : "r"(a0), "r"(a1), "r"(b), "r"(0));
                    // d4*(sumi*d8 - 4*s8) added to the thread's sum: the one-column kernel's two FMAs.
                    acc[lj][m][n][0] = __fmaf_rn(da, __fmaf_rn(s0.x, (float) c0, s0.y), acc[lj][m][n][0]);
                    acc[lj][m][n][1] = __fmaf_rn(da, __fmaf_rn(s1.x, (float) c1, s1.y), acc[lj][m][n][1]);
                    acc[lj][m][n][2] = __fmaf_rn(db, __fmaf_rn(s0.x, (float) c2, s0.y), acc[lj][m][n][2]);
                    acc[lj][m][n][3] = __fmaf_rn(db, __fmaf_rn(s1.x, (float) c3, s1.y), acc[lj][m][n][3]);
                }
            }
        }
        __syncthreads(); // the buffer is refilled next
        if ((step + 1) % nslabs != 0) {
            continue;
        }

        // The tile is done. Each lane's sum, ((a_l + a_{32+l}) + a_{64+l}) + a_{96+l}, to shared
        // memory ([output][lane], padded against bank conflicts); the next write to it comes
        // after the next slab's barriers.
#pragma unroll
        for (int lj = 0; lj < 2; ++lj) {
#pragma unroll
            for (int n = 0; n < ntiles; ++n) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    float sum = acc[lj][0][n][e];
                    sum += acc[lj][1][n][e];
                    sum += acc[lj][2][n][e];
                    sum += acc[lj][3][n][e];
                    lane_sums[128*n + 8*(g + 8*(e >> 1)) + 2*q + (e & 1)][threadIdx.y + AXLE_CI_MMA_WARPS*lj] = sum;
#pragma unroll
                    for (int m = 0; m < 4; ++m) {
                        acc[lj][m][n][e] = 0.0f;
                    }
                }
            }
        }
        __syncthreads();

        // The butterfly (warp_reduce_sum): at offset o, lane i adds lane i + o, for o = 16, 8, 4, 2, 1.
        const int w = blockIdx.x + (step/nslabs)*gridDim.x;
        const int col0 = cols*(w % col_tiles);
        const int row0 = 16*(w / col_tiles);
        for (int o = tid; o < ntiles*128; o += AXLE_CI_MMA_WARPS*WARP_SIZE) {
            float v[WARP_SIZE];
#pragma unroll
            for (int k = 0; k < WARP_SIZE; ++k) {
                v[k] = lane_sums[o][k];
            }
#define AXLE_CI_BUTTERFLY(off) _Pragma("unroll") for (int k = 0; k < (off); ++k) { v[k] += v[k + (off)]; }
            AXLE_CI_BUTTERFLY(16) AXLE_CI_BUTTERFLY(8) AXLE_CI_BUTTERFLY(4) AXLE_CI_BUTTERFLY(2) AXLE_CI_BUTTERFLY(1)
#undef AXLE_CI_BUTTERFLY
            const int row = row0 + (o % 128)/8;
            const int col = col0 + 8*(o/128) + o%8;
            if (row < nrows_x && col < ncols_y) {
                dst[(int64_t) col*stride_col_dst + row] = v[0];
            }
        }
    }
#else
    GGML_UNUSED_VARS(vx, vy, scales, dst, blocks_per_row_x, nrows_x, stride_row_x, stride_col_y,
        stride_col_dst, ncols_y);
    NO_DEVICE_CODE;
#endif // AMPERE_MMA_AVAILABLE
}

// Whether the tensor-core variant runs: every device Ampere or newer with code compiled for it and
// room for the 16-column block's shared memory (158.5 KiB: A100, H100 and the like; not the 99 KiB
// of consumer cards), unless AXLE_CI_MMA=0 (kept for measurements against the dp4a kernel).
static bool axle_ci_mma_enabled() {
    static const bool enabled = [] {
        const char * env = getenv("AXLE_CI_MMA");
        if (env != nullptr && strcmp(env, "0") == 0) {
            return false;
        }
        for (int id = 0; id < ggml_cuda_info().device_count; ++id) {
            if (!ampere_mma_available(ggml_cuda_info().devices[id].cc) ||
                    ggml_cuda_info().devices[id].smpbo < (size_t) axle_ci_mma_shared_bytes<2>()) {
                return false;
            }
        }
        return true;
    }();
    return enabled;
}

template <int ntiles>
static void axle_ci_mma_launch_q4_0(
        ggml_backend_cuda_context & ctx, const void * vx, const block_q8_1 * vy, float * dst,
        const int ncols_x, const int nrows_x, const int stride_row_x, const int stride_col_y,
        const int stride_col_dst, const int ncols_y, cudaStream_t stream) {
    const int nscales = ncols_y*stride_col_y;
    ggml_cuda_pool_alloc<float2> scales(ctx.pool(), nscales);
    axle_launch(axle_ci_q8_1_scales, ggml_cuda_kernel_launch_params((nscales + 255)/256, 256, 0, stream),
        vy, scales.get(), nscales);
    constexpr int nbytes = axle_ci_mma_shared_bytes<ntiles>();
    CUDA_SET_SHARED_MEMORY_LIMIT(axle_ci_mma_q4_0<ntiles>, nbytes);
    // One block per SM (registers and shared memory allow no more), each walking several tiles.
    const int nwork = ((ncols_y + 8*ntiles - 1)/(8*ntiles))*((nrows_x + 15)/16);
    const dim3 block_dims(WARP_SIZE, AXLE_CI_MMA_WARPS, 1);
    const dim3 block_nums(std::min(nwork, ggml_cuda_info().devices[ggml_cuda_get_device()].nsm), 1, 1);
    axle_launch(axle_ci_mma_q4_0<ntiles>, ggml_cuda_kernel_launch_params(block_nums, block_dims, nbytes, stream),
        (const char *) vx, (const char *) vy, (const char *) scales.get(), dst, ncols_x/QK4_0, nrows_x,
        stride_row_x, stride_col_y, stride_col_dst, ncols_y);
}

// Block shape: AXLE_CI_SHAPE=CxR[oN] picks one of the instantiated shapes (for measurements); by
// default (-1 here) 8 columns by 4 rows with 4 blocks per SM (the fastest of 13 shapes on an
// H200, docs/gpu.md), 16 by 2 for Q6_K's own kernel (with its prefetch 1-2% faster a step than
// 8 by 4 in one H200 session, level in another: benchmarks/artifacts/gpu/experiments/
// q6k-head-prefetch/), 8 by 2 for products of at most 8 columns.
static int axle_ci_shape() {
    static const int shape = [] {
        const char * env = getenv("AXLE_CI_SHAPE");
        static const char * names[] = {"8x4o4", "8x2", "16x2o4", "16x4o2", "32x2o2", "16x1o6", "16x2o5", "8x4o5", "16x2", "4x4o4"};
        for (int i = 0; env != nullptr && i < (int) (sizeof(names)/sizeof(names[0])); ++i) {
            if (strcmp(env, names[i]) == 0) {
                return i;
            }
        }
        return -1;
    }();
    return shape;
}

template <ggml_type type, int cols, int rows, int min_blocks>
static void axle_ci_launch_shape(
        const void * vx, const block_q8_1 * vy, float * dst, const int ncols_x, const int nrows_x,
        const int stride_row_x, const int stride_col_y, const int stride_col_dst, const int ncols_y,
        cudaStream_t stream) {
    constexpr int qk = ggml_cuda_type_traits<type>::qk;
    const dim3 block_dims(WARP_SIZE, AXLE_CI_WARPS, 1);
    const dim3 block_nums((nrows_x + rows - 1)/rows, (ncols_y + cols - 1)/cols, 1);
    if constexpr (type == GGML_TYPE_Q6_K) {
        if (axle_ci_q6_K_enabled()) {
            axle_launch(axle_ci_mul_mat_vec_q6_K<cols, rows, min_blocks>,
                ggml_cuda_kernel_launch_params(block_nums, block_dims, 0, stream),
                vx, vy, dst, ncols_x/qk, nrows_x, stride_row_x, stride_col_y, stride_col_dst, ncols_y);
            return;
        }
    }
    axle_launch(axle_ci_mul_mat_vec_q<type, cols, rows, min_blocks>,
        ggml_cuda_kernel_launch_params(block_nums, block_dims, 0, stream),
        vx, vy, dst, ncols_x/qk, nrows_x, stride_row_x, stride_col_y, stride_col_dst, ncols_y);
}

template <ggml_type type>
static void axle_ci_launch(
        const void * vx, const block_q8_1 * vy, float * dst, const int ncols_x, const int nrows_x,
        const int stride_row_x, const int stride_col_y, const int stride_col_dst, const int ncols_y,
        cudaStream_t stream) {
#define AXLE_CI_SHAPE(c, r, o) axle_ci_launch_shape<type, c, r, o>( \
        vx, vy, dst, ncols_x, nrows_x, stride_row_x, stride_col_y, stride_col_dst, ncols_y, stream)
    const int shape = ncols_y <= 8 ? 1 : axle_ci_shape();
    switch (shape >= 0 ? shape : (type == GGML_TYPE_Q6_K && axle_ci_q6_K_enabled() ? 2 : 0)) {
        case 1: AXLE_CI_SHAPE(8, 2, 1); break;
        case 2: AXLE_CI_SHAPE(16, 2, 4); break;
        case 3: AXLE_CI_SHAPE(16, 4, 2); break;
        case 4: AXLE_CI_SHAPE(32, 2, 2); break;
        case 5: AXLE_CI_SHAPE(16, 1, 6); break;
        case 6: AXLE_CI_SHAPE(16, 2, 5); break;
        case 7: AXLE_CI_SHAPE(8, 4, 5); break;
        case 8: AXLE_CI_SHAPE(16, 2, 1); break;
        case 9: AXLE_CI_SHAPE(4, 4, 4); break;
        default: AXLE_CI_SHAPE(8, 4, 4); break;
    }
#undef AXLE_CI_SHAPE
}

// Whether every CUDA device of this process sums a one-column MMVQ row as above (the generic
// parameter table) and `type` is covered. Exported through the CUDA registry's get_proc_address
// as "axle_column_invariant_mmvq".
// Also required: ggml itself takes MMVQ for 1 to 4 columns of the type (Axle leaves products of
// up to 4 columns to ggml; on Jetson Orin ggml sends K-quants of 2 or more columns to MMQ).
extern "C" bool ggml_cuda_axle_ci_supports(ggml_type type) {
    if (!axle_ci_type(type) || ggml_cuda_info().device_count == 0) {
        return false;
    }
    for (int id = 0; id < ggml_cuda_info().device_count; ++id) {
        const int cc = ggml_cuda_info().devices[id].cc;
        if (!GGML_CUDA_CC_IS_NVIDIA(cc) || get_device_table_id(cc) != MMVQ_PARAMETERS_GENERIC ||
                ggml_cuda_info().devices[id].warp_size != WARP_SIZE ||
                !ggml_cuda_should_use_mmvq(type, cc, 4)) {
            return false;
        }
    }
    return true;
}

// Whether `dst = src0 @ src1` is a product Axle's kernels take at all: a 2-D weight outside the
// compute buffer (its padding is never cleared) with elements side by side, F32 columns and
// result, one matrix each. Both hooks (this file's and the replay of MMQ's) ask it first.
bool ggml_cuda_axle_plain_product(const ggml_tensor * src0, const ggml_tensor * src1, const ggml_tensor * dst) {
    return src1->type == GGML_TYPE_F32 && dst->type == GGML_TYPE_F32 &&
        ggml_backend_buffer_get_usage(src0->buffer) != GGML_BACKEND_BUFFER_USAGE_COMPUTE &&
        src0->ne[2] == 1 && src0->ne[3] == 1 && src1->ne[2] == 1 && src1->ne[3] == 1 &&
        src0->nb[0] == ggml_type_size(src0->type) && src1->nb[0] == sizeof(float) && dst->nb[0] == sizeof(float);
}

// Runs `dst = src0 @ src1` with the kernel above if `dst` carries Axle's hint and the op fits
// (a 2-D quantized weight outside the compute buffer, F32 columns and result); false otherwise,
// and the caller goes on with ggml's own choice.
bool ggml_cuda_axle_ci_mul_mat(
        ggml_backend_cuda_context & ctx, const ggml_tensor * src0, const ggml_tensor * src1, ggml_tensor * dst) {
    if (ggml_get_op_params_i32(dst, 1) != AXLE_HINT_COLUMN_INVARIANT) {
        return false;
    }
    // A hinted product the kernel cannot take would lose its invariance without a sign: say so.
    if (!ggml_cuda_axle_ci_supports(src0->type) || !ggml_cuda_axle_plain_product(src0, src1, dst) ||
            src0->ne[0] % ggml_blck_size(src0->type) != 0) {
        static bool warned = false; // once per process
        if (!warned) {
            warned = true;
            GGML_LOG_WARN("%s: Axle's column-invariant product refused for %s (%s weight): ggml's kernel runs it, "
                "and its columns may round differently by batch\n", __func__, dst->name, ggml_type_name(src0->type));
        }
        return false;
    }
    cudaStream_t stream = ctx.stream();
    const int64_t ne10 = src1->ne[0];
    const int64_t ne11 = src1->ne[1];
    const int64_t ne10_padded = GGML_PAD(ne10, MATRIX_ROW_PADDING);
    ggml_cuda_pool_alloc<char> src1_q8_1(ctx.pool(), ne11*ne10_padded*sizeof(block_q8_1)/QK8_1);
    const int64_t s11 = src1->nb[1]/sizeof(float);
    quantize_row_q8_1_cuda((const float *) src1->data, nullptr, src1_q8_1.get(), src0->type, ne10, s11, s11*ne11,
        s11*ne11, ne10_padded, ne11, 1, 1, stream);

    const void * vx = src0->data;
    const block_q8_1 * vy = (const block_q8_1 *) src1_q8_1.get();
    float * d = (float *) dst->data;
    const int ncols_x = src0->ne[0];
    const int nrows_x = src0->ne[1];
    const int stride_row_x = src0->nb[1]/ggml_type_size(src0->type);
    const int stride_col_y = ne10_padded/QK8_1;
    const int stride_col_dst = dst->nb[1]/sizeof(float);
    const int ncols_y = ne11;
    // The tensor-core variant: whole slabs of 2048 weights, rows and columns 16-byte aligned.
    if (src0->type == GGML_TYPE_Q4_0 && axle_ci_mma_enabled() && ncols_x > 0 && ncols_x % (AXLE_CI_SLAB_BLOCKS*QK4_0) == 0 &&
            (stride_row_x*sizeof(block_q4_0)) % 16 == 0 && (uintptr_t) vx % 16 == 0 &&
            (stride_col_y*sizeof(block_q8_1)) % 16 == 0) {
        if (ncols_y <= 8) {
            axle_ci_mma_launch_q4_0<1>(ctx, vx, vy, d, ncols_x, nrows_x, stride_row_x, stride_col_y, stride_col_dst, ncols_y, stream);
        } else {
            axle_ci_mma_launch_q4_0<2>(ctx, vx, vy, d, ncols_x, nrows_x, stride_row_x, stride_col_y, stride_col_dst, ncols_y, stream);
        }
        return true;
    }
    switch (src0->type) {
#define AXLE_CI_CASE(t) \
        case t: axle_ci_launch<t>(vx, vy, d, ncols_x, nrows_x, stride_row_x, stride_col_y, stride_col_dst, ncols_y, stream); break;
        AXLE_CI_CASE(GGML_TYPE_Q4_0)
        AXLE_CI_CASE(GGML_TYPE_Q4_1)
        AXLE_CI_CASE(GGML_TYPE_Q5_0)
        AXLE_CI_CASE(GGML_TYPE_Q5_1)
        AXLE_CI_CASE(GGML_TYPE_Q8_0)
        AXLE_CI_CASE(GGML_TYPE_MXFP4)
        AXLE_CI_CASE(GGML_TYPE_Q2_K)
        AXLE_CI_CASE(GGML_TYPE_Q3_K)
        AXLE_CI_CASE(GGML_TYPE_Q4_K)
        AXLE_CI_CASE(GGML_TYPE_Q5_K)
        AXLE_CI_CASE(GGML_TYPE_Q6_K)
        AXLE_CI_CASE(GGML_TYPE_IQ4_NL)
        AXLE_CI_CASE(GGML_TYPE_IQ4_XS)
#undef AXLE_CI_CASE
        default: return false;
    }
    return true;
}
