typedef double real;  // the eigensolver of sym3.cuh (prepended by gpu/cuda.py) runs in double
// Fused diffusion tensor fit: OLS -> WLS normal equations -> 7x7 Cholesky ->
// 3x3 eigen-decomposition -> FA, MD, AD, RD, colour FA, per voxel, in one pass.
//
// The algorithm is exactly the array-module path of gpu/dti.py (its NumPy run is
// the reference): same design scaling, same weights W = exp(2 * min(X[:,1:] b, 30)),
// same Cholesky pivot test, the same Eberly eigensolver as gpu/sym3.py, the same
// flags. What changes is the memory traffic: the array path makes ~10 passes over
// the (voxels x volumes) data and ~500 launches over the voxels; here the signal
// row is read twice per voxel (the second time mostly from cache) and every
// output is written once.
//
// Layout: one warp per voxel. Lanes stride over the K measurements of the
// voxel's row (row-major (N, K): coalesced), sums are reduced with shuffles,
// and lane 0 solves and decomposes. Sums are accumulated in double; the log and
// exp run in the input precision T, like the array path.

#define FULL_MASK 0xffffffffu
// The flag bits of DTIFit.flags, passed by gpu/dti.py.
#ifndef FLAG_NONFINITE_SIGNAL
#error "FLAG_NONFINITE_SIGNAL is a compile-time constant defined by gpu/dti.py"
#endif
#ifndef FLAG_NO_SIGNAL
#error "FLAG_NO_SIGNAL is a compile-time constant defined by gpu/dti.py"
#endif
#ifndef FLAG_FIT_FAILED
#error "FLAG_FIT_FAILED is a compile-time constant defined by gpu/dti.py"
#endif
#ifndef FLAG_NOT_POSITIVE_DEFINITE
#error "FLAG_NOT_POSITIVE_DEFINITE is a compile-time constant defined by gpu/dti.py"
#endif

__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(FULL_MASK, v, offset);
    return v;
}

__device__ __forceinline__ float log_t(float x) { return logf(x); }
__device__ __forceinline__ double log_t(double x) { return log(x); }
__device__ __forceinline__ float exp_t(float x) { return expf(x); }
__device__ __forceinline__ double exp_t(double x) { return exp(x); }
__device__ __forceinline__ bool finite_t(float x) { return isfinite(x); }
__device__ __forceinline__ bool finite_t(double x) { return isfinite(x); }

// Packed index of (i, j), i <= j, in the 28 unique entries of a symmetric 7x7.
__device__ __forceinline__ int tri7(int i, int j) { return i * 7 - (i * (i - 1)) / 2 + (j - i); }

template <typename T>
__device__ void fit_voxel(
    const T* __restrict__ signal, long long n, int k,
    const double* __restrict__ X,      // (K, 7) scaled design matrix
    const double* __restrict__ pinv,   // (7, K)
    const unsigned char* __restrict__ is_b0,
    int wls, T min_signal, double b_scale, double min_diffusivity,
    double* __restrict__ tensor_out, double* __restrict__ s0_out, double* __restrict__ evals_out,
    double* __restrict__ evecs_out, double* __restrict__ fa_out, double* __restrict__ md_out,
    double* __restrict__ ad_out, double* __restrict__ rd_out, double* __restrict__ rgb_out,
    unsigned char* __restrict__ flags_out)
{
    long long voxel = (long long)(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x & 31;
    if (voxel >= n) return;  // whole warps exit together
    const T* row = signal + voxel * (long long)k;

    // Pass 1: sanity, b=0 maximum, OLS estimate.
    int nonfinite = 0;
    double b0_max = -1e300;
    double beta[7] = {0, 0, 0, 0, 0, 0, 0};
    for (int m = lane; m < k; m += 32) {
        T s = row[m];
        if (!finite_t(s)) { nonfinite = 1; s = (T)1; }
        if (is_b0[m]) b0_max = fmax(b0_max, (double)s);
        double ls = (double)log_t(s > min_signal ? s : min_signal);
#pragma unroll
        for (int j = 0; j < 7; ++j) beta[j] += pinv[j * k + m] * ls;
    }
    nonfinite = __any_sync(FULL_MASK, nonfinite);
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) b0_max = fmax(b0_max, __shfl_xor_sync(FULL_MASK, b0_max, offset));
#pragma unroll
    for (int j = 0; j < 7; ++j) beta[j] = warp_sum(beta[j]);

    bool singular = false;
    if (wls) {
        // Pass 2: weighted normal equations (X^T W X) b = X^T W ln S, W = exp(2 X[:,1:] b[1:]).
        double a[28], r[7];
#pragma unroll
        for (int i = 0; i < 28; ++i) a[i] = 0.0;
#pragma unroll
        for (int i = 0; i < 7; ++i) r[i] = 0.0;
        for (int m = lane; m < k; m += 32) {
            T s = row[m];
            if (!finite_t(s)) s = (T)1;
            double ls = (double)log_t(s > min_signal ? s : min_signal);
            double x[7];
#pragma unroll
            for (int j = 0; j < 7; ++j) x[j] = X[m * 7 + j];
            double pred = 0.0;
#pragma unroll
            for (int j = 1; j < 7; ++j) pred += x[j] * beta[j];
            double w = (double)exp_t((T)fmin(2.0 * pred, 60.0));
#pragma unroll
            for (int i = 0; i < 7; ++i) {
                double wx = w * x[i];
                r[i] += wx * ls;
#pragma unroll
                for (int j = i; j < 7; ++j) a[tri7(i, j)] += wx * x[j];
            }
        }
#pragma unroll
        for (int i = 0; i < 28; ++i) a[i] = warp_sum(a[i]);
#pragma unroll
        for (int i = 0; i < 7; ++i) r[i] = warp_sum(r[i]);
        if (lane != 0) return;
        // Cholesky L L^T = A in place of the packed lower factor (stored by (i, j) i >= j as tri7(j, i)).
        double L[28];
#pragma unroll
        for (int j = 0; j < 7; ++j) {
            double d = a[tri7(j, j)];
#pragma unroll
            for (int m = 0; m < j; ++m) d -= L[tri7(m, j)] * L[tri7(m, j)];
            bool bad = !(d > 1e-300);
            singular |= bad;
            double diag = sqrt(bad ? 1.0 : d);
            L[tri7(j, j)] = diag;
#pragma unroll
            for (int i = j + 1; i < 7; ++i) {
                double t = a[tri7(j, i)];
#pragma unroll
                for (int m = 0; m < j; ++m) t -= L[tri7(m, i)] * L[tri7(m, j)];
                L[tri7(j, i)] = t / diag;
            }
        }
        double y[7];
#pragma unroll
        for (int i = 0; i < 7; ++i) {
            double t = r[i];
#pragma unroll
            for (int m = 0; m < i; ++m) t -= L[tri7(m, i)] * y[m];
            y[i] = t / L[tri7(i, i)];
        }
#pragma unroll
        for (int i = 6; i >= 0; --i) {
            double t = y[i];
#pragma unroll
            for (int m = i + 1; m < 7; ++m) t -= L[tri7(i, m)] * beta[m];
            beta[i] = t / L[tri7(i, i)];
        }
    } else if (lane != 0) {
        return;
    }

    // Lane 0: tensor, flags, eigen-decomposition, scalar maps.
    bool no_signal = !(b0_max > 0.0);
    double s0 = exp(beta[0]);
    bool beta_finite = true;
#pragma unroll
    for (int j = 0; j < 7; ++j) beta_finite &= (bool)isfinite(beta[j]);
    bool failed = singular || !beta_finite || !isfinite(s0);
    bool skip = nonfinite || no_signal || failed;
    double t[6];
#pragma unroll
    for (int j = 0; j < 6; ++j) t[j] = skip ? 0.0 : beta[j + 1] / b_scale;
    s0 = skip ? 0.0 : s0;
    double lam[3];
    R3 vec[3];
    eigh3(t, lam, vec);
    bool not_pd = (lam[2] <= 0.0) && !skip;
#pragma unroll
    for (int j = 0; j < 3; ++j) lam[j] = skip ? 0.0 : fmax(lam[j], min_diffusivity);
    double norm2 = lam[0] * lam[0] + lam[1] * lam[1] + lam[2] * lam[2];
    double spread = (lam[0] - lam[1]) * (lam[0] - lam[1]) + (lam[0] - lam[2]) * (lam[0] - lam[2]) +
                    (lam[1] - lam[2]) * (lam[1] - lam[2]);
    double fa = norm2 > 0.0 ? sqrt(0.5 * spread / norm2) : 0.0;

    unsigned char flags = 0;
    if (nonfinite) flags |= FLAG_NONFINITE_SIGNAL;
    else if (no_signal) flags |= FLAG_NO_SIGNAL;
    else if (failed) flags |= FLAG_FIT_FAILED;
    if (not_pd) flags |= FLAG_NOT_POSITIVE_DEFINITE;

#pragma unroll
    for (int j = 0; j < 6; ++j) tensor_out[voxel * 6 + j] = t[j];
    s0_out[voxel] = s0;
#pragma unroll
    for (int j = 0; j < 3; ++j) {
        evals_out[voxel * 3 + j] = lam[j];
        // evecs[voxel, i, j]: component i of eigenvector j (column convention).
        evecs_out[voxel * 9 + 0 * 3 + j] = vec[j].x;
        evecs_out[voxel * 9 + 1 * 3 + j] = vec[j].y;
        evecs_out[voxel * 9 + 2 * 3 + j] = vec[j].z;
    }
    fa_out[voxel] = fa;
    md_out[voxel] = (lam[0] + lam[1] + lam[2]) / 3.0;
    ad_out[voxel] = lam[0];
    rd_out[voxel] = 0.5 * (lam[1] + lam[2]);
    rgb_out[voxel * 3 + 0] = fmin(fmax(fabs(vec[0].x) * fa, 0.0), 1.0);
    rgb_out[voxel * 3 + 1] = fmin(fmax(fabs(vec[0].y) * fa, 0.0), 1.0);
    rgb_out[voxel * 3 + 2] = fmin(fmax(fabs(vec[0].z) * fa, 0.0), 1.0);
    flags_out[voxel] = flags;
}

#define DTI_FIT_KERNEL(NAME, T)                                                                        \
    extern "C" __global__ void __launch_bounds__(256) NAME(                                            \
        const T* signal, long long n, int k, const double* X, const double* pinv,                      \
        const unsigned char* is_b0, int wls, T min_signal, double b_scale, double min_diffusivity,     \
        double* tensor, double* s0, double* evals, double* evecs, double* fa, double* md, double* ad,  \
        double* rd, double* rgb, unsigned char* flags) {                                               \
        fit_voxel<T>(signal, n, k, X, pinv, is_b0, wls, min_signal, b_scale, min_diffusivity, tensor,  \
                     s0, evals, evecs, fa, md, ad, rd, rgb, flags);                                    \
    }

DTI_FIT_KERNEL(dti_fit_float32, float)
DTI_FIT_KERNEL(dti_fit_float64, double)
