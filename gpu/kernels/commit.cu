// COMMIT's operator (gpu/commit.py; apply_a_numpy / apply_at_numpy are the reference).
// A x: one warp per voxel row, lanes over the measurements (MPL per lane, compile-time),
// the row's segments, EC and ISO compartments summed in double; no atomics.
// A^T y: the same warps compute, per segment, length * <LUT_IC[o], y[row]> (a warp
// reduction per segment) and the EC and ISO entries of their row; a second kernel sums
// the segment values per streamline through the streamline-sorted permutation.
// Any number of measurements up to 32 * MPL and any block size work, and any row may be
// empty; offsets are added once and every reduction is a warp shuffle.

// Compile-time constants, passed by gpu/commit.py (kernel_defines):
//   MPL      measurements per lane: up to 32 * MPL measurements
//   NIC      IC responses per streamline (columns j * n_fibers + f; LUT_IC (NIC, NORIENT, M))
//   NORIENT  orientations per look-up table
#ifndef MPL
#error "MPL is a compile-time constant defined by gpu/commit.py"
#endif
#ifndef NIC
#error "NIC is a compile-time constant defined by gpu/commit.py"
#endif
#ifndef NORIENT
#error "NORIENT is a compile-time constant defined by gpu/commit.py"
#endif

__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// acc[k] += w * lut[m] over the lane's measurements m = lane + 32 k.
__device__ __forceinline__ void add_row(double (&acc)[MPL], double w, const float* __restrict__ lut, int lane, int M) {
#pragma unroll
    for (int k = 0; k < MPL; ++k) {
        const int m = lane + 32 * k;
        if (m < M) acc[k] += w * (double)__ldg(lut + m);
    }
}

// <lut, y> over all M measurements (the warp's lanes hold y in yr), in every lane.
__device__ __forceinline__ double dot_row(const float* __restrict__ lut, const double (&yr)[MPL], int lane, int M) {
    double part = 0.0;
#pragma unroll
    for (int k = 0; k < MPL; ++k) {
        const int m = lane + 32 * k;
        if (m < M) part += (double)__ldg(lut + m) * yr[k];
    }
    return warp_sum(part);
}

extern "C" __global__ void commit_a(const double* __restrict__ x, int n_rows, int M, int n_fibers, int n_ec, int n_iso,
                                    const long long* __restrict__ row_start, const int* __restrict__ seg_fiber,
                                    const double* __restrict__ seg_len, const int* __restrict__ seg_orient,
                                    const long long* __restrict__ ec_start, const int* __restrict__ ec_orient,
                                    const float* __restrict__ lut_ic, const float* __restrict__ lut_ec,
                                    const float* __restrict__ lut_iso, double* __restrict__ y) {
    const int lane = threadIdx.x & 31;
    const long long warps = (long long)gridDim.x * (blockDim.x >> 5);
    for (long long row = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); row < n_rows; row += warps) {
        double acc[MPL];
#pragma unroll
        for (int k = 0; k < MPL; ++k) acc[k] = 0.0;
        for (long long s = row_start[row]; s < row_start[row + 1]; ++s) {
#pragma unroll
            for (int j = 0; j < NIC; ++j)
                add_row(acc, seg_len[s] * x[(long long)j * n_fibers + seg_fiber[s]],
                        lut_ic + ((size_t)j * NORIENT + seg_orient[s]) * M, lane, M);
        }
        const long long ic_cols = (long long)NIC * n_fibers;
        for (long long c = ec_start[row]; c < ec_start[row + 1]; ++c)
            add_row(acc, x[ic_cols + c], lut_ec + (size_t)ec_orient[c] * M, lane, M);
        for (int j = 0; j < n_iso; ++j)
            add_row(acc, x[ic_cols + n_ec + row * n_iso + j], lut_iso + (size_t)j * M, lane, M);
#pragma unroll
        for (int k = 0; k < MPL; ++k) {
            const int m = lane + 32 * k;
            if (m < M) y[row * M + m] = acc[k];
        }
    }
}

extern "C" __global__ void commit_at_rows(const double* __restrict__ y, int n_rows, int M, int n_fibers, int n_ec,
                                          int n_iso, const long long* __restrict__ row_start,
                                          const double* __restrict__ seg_len, const int* __restrict__ seg_orient,
                                          const long long* __restrict__ ec_start, const int* __restrict__ ec_orient,
                                          const float* __restrict__ lut_ic, const float* __restrict__ lut_ec,
                                          const float* __restrict__ lut_iso, double* __restrict__ seg_value,
                                          double* __restrict__ x) {
    const int lane = threadIdx.x & 31;
    const long long warps = (long long)gridDim.x * (blockDim.x >> 5);
    for (long long row = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); row < n_rows; row += warps) {
        double yr[MPL];
#pragma unroll
        for (int k = 0; k < MPL; ++k) {
            const int m = lane + 32 * k;
            yr[k] = m < M ? y[row * M + m] : 0.0;
        }
        for (long long s = row_start[row]; s < row_start[row + 1]; ++s) {
#pragma unroll
            for (int j = 0; j < NIC; ++j) {
                const double part = dot_row(lut_ic + ((size_t)j * NORIENT + seg_orient[s]) * M, yr, lane, M);
                if (lane == 0) seg_value[s * NIC + j] = seg_len[s] * part;
            }
        }
        const long long ic_cols = (long long)NIC * n_fibers;
        for (long long c = ec_start[row]; c < ec_start[row + 1]; ++c) {
            const double part = dot_row(lut_ec + (size_t)ec_orient[c] * M, yr, lane, M);
            if (lane == 0) x[ic_cols + c] = part;
        }
        for (int j = 0; j < n_iso; ++j) {
            const double part = dot_row(lut_iso + (size_t)j * M, yr, lane, M);
            if (lane == 0) x[ic_cols + n_ec + row * n_iso + j] = part;
        }
    }
}

// x_IC[j n_fibers + f] = sum of the segment values (response j) of streamline f (segments
// listed by streamline in `order`).
extern "C" __global__ void commit_at_fibers(const double* __restrict__ seg_value, const long long* __restrict__ order,
                                            const long long* __restrict__ fiber_start, int n_fibers,
                                            double* __restrict__ x) {
    for (long long f = (long long)blockIdx.x * blockDim.x + threadIdx.x; f < n_fibers;
         f += (long long)gridDim.x * blockDim.x) {
        double sum[NIC];
#pragma unroll
        for (int j = 0; j < NIC; ++j) sum[j] = 0.0;
        for (long long i = fiber_start[f]; i < fiber_start[f + 1]; ++i) {
            const long long s = order[i];
#pragma unroll
            for (int j = 0; j < NIC; ++j) sum[j] += seg_value[s * NIC + j];
        }
#pragma unroll
        for (int j = 0; j < NIC; ++j) x[(long long)j * n_fibers + f] = sum[j];
    }
}

// Squared norms of the IC columns: streamline f's column j is, per voxel row, the sum of
// length * LUT_IC[j, o] over its segments there. One warp per (response, streamline), the
// segments listed by `order` grouped by row (rows ascending), lanes over the measurements.
extern "C" __global__ void commit_ic_norms(const long long* __restrict__ order, const long long* __restrict__ fiber_start,
                                           int n_fibers, int M, const int* __restrict__ seg_row,
                                           const double* __restrict__ seg_len, const int* __restrict__ seg_orient,
                                           const float* __restrict__ lut_ic, double* __restrict__ norm2) {
    const int lane = threadIdx.x & 31;
    const long long warps = (long long)gridDim.x * (blockDim.x >> 5);
    for (long long col = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); col < (long long)NIC * n_fibers;
         col += warps) {
        const long long f = col % n_fibers;
        const float* lut = lut_ic + (size_t)(col / n_fibers) * NORIENT * M;
        double acc[MPL];
        double total = 0.0;
        int current = -1;
#pragma unroll
        for (int k = 0; k < MPL; ++k) acc[k] = 0.0;
        for (long long i = fiber_start[f]; i <= fiber_start[f + 1]; ++i) {
            const long long s = i < fiber_start[f + 1] ? order[i] : -1;
            const int row = s >= 0 ? seg_row[s] : -2;
            if (row != current) {  // a voxel's vector is complete: add its squared norm
                double part = 0.0;
#pragma unroll
                for (int k = 0; k < MPL; ++k) {
                    part += acc[k] * acc[k];
                    acc[k] = 0.0;
                }
                total += warp_sum(part);
                current = row;
            }
            if (s >= 0) add_row(acc, seg_len[s], lut + (size_t)seg_orient[s] * M, lane, M);
        }
        if (lane == 0) norm2[col] = total;
    }
}
