// Axle's column-invariant quantized products, appended to ggml's ggml-cuda/mmvq.cu by
// scripts/build-backend.sh (so that it sees that file's vec-dot table), with a hook in
// ggml_cuda_mul_mat (both by scripts/cuda/apply.py). Written for Axle; not part of ggml.
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

// One block: `rows` output rows times up to `cols` columns (blockIdx.y picks the columns), with at
// least `min_blocks` blocks resident per SM (a register cap). None of them changes a row's
// arithmetic: they trade registers and occupancy against loads of the columns and weights.
template <ggml_type type, int cols, int rows, int min_blocks>
__launch_bounds__(AXLE_CI_WARPS*WARP_SIZE, min_blocks)
static __global__ void axle_ci_mul_mat_vec_q(
        const void * __restrict__ vx, const block_q8_1 * __restrict__ vy, float * __restrict__ dst,
        const int blocks_per_row_x, const int nrows_x, const int stride_row_x,
        const int stride_col_y, const int stride_col_dst, const int ncols_y) {
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

    // Warps 1..3 hand over their partial sums; warp 0 adds them in warp order, then reduces.
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

// Block shape: AXLE_CI_SHAPE=CxR[oN] picks one of the instantiated shapes (for measurements); by
// default 8 columns by 4 rows with 4 blocks per SM (the fastest of 13 shapes on an H200,
// docs/gpu.md), 8 by 2 for products of at most 8 columns.
static int axle_ci_shape() {
    static const int shape = [] {
        const char * env = getenv("AXLE_CI_SHAPE");
        static const char * names[] = {"8x4o4", "8x2", "16x2o4", "16x4o2", "32x2o2", "16x1o6", "16x2o5", "8x4o5", "16x2", "4x4o4"};
        for (int i = 0; env != nullptr && i < (int) (sizeof(names)/sizeof(names[0])); ++i) {
            if (strcmp(env, names[i]) == 0) {
                return i;
            }
        }
        return 0;
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
    axle_ci_mul_mat_vec_q<type, cols, rows, min_blocks><<<block_nums, block_dims, 0, stream>>>(
        vx, vy, dst, ncols_x/qk, nrows_x, stride_row_x, stride_col_y, stride_col_dst, ncols_y);
    CUDA_CHECK(cudaGetLastError());
}

template <ggml_type type>
static void axle_ci_launch(
        const void * vx, const block_q8_1 * vy, float * dst, const int ncols_x, const int nrows_x,
        const int stride_row_x, const int stride_col_y, const int stride_col_dst, const int ncols_y,
        cudaStream_t stream) {
#define AXLE_CI_SHAPE(c, r, o) axle_ci_launch_shape<type, c, r, o>( \
        vx, vy, dst, ncols_x, nrows_x, stride_row_x, stride_col_y, stride_col_dst, ncols_y, stream)
    switch (ncols_y <= 8 ? 1 : axle_ci_shape()) {
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

// Runs `dst = src0 @ src1` with the kernel above if `dst` carries Axle's hint and the op fits
// (a 2-D quantized weight outside the compute buffer, F32 columns and result); false otherwise,
// and the caller goes on with ggml's own choice.
bool ggml_cuda_axle_ci_mul_mat(
        ggml_backend_cuda_context & ctx, const ggml_tensor * src0, const ggml_tensor * src1, ggml_tensor * dst) {
    if (ggml_get_op_params_i32(dst, 1) != AXLE_HINT_COLUMN_INVARIANT) {
        return false;
    }
    // A hinted product the kernel cannot take would lose its invariance without a sign: say so.
    if (!ggml_cuda_axle_ci_supports(src0->type) ||
            src1->type != GGML_TYPE_F32 || dst->type != GGML_TYPE_F32 ||
            ggml_backend_buffer_get_usage(src0->buffer) == GGML_BACKEND_BUFFER_USAGE_COMPUTE ||
            src0->ne[2] != 1 || src0->ne[3] != 1 || src1->ne[2] != 1 || src1->ne[3] != 1 ||
            src0->nb[0] != ggml_type_size(src0->type) || src1->nb[0] != sizeof(float) ||
            dst->nb[0] != sizeof(float) || src0->ne[0] % ggml_blck_size(src0->type) != 0) {
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
