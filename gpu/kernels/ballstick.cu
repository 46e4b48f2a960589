// Ball & sticks fitting (gpu/ballstick.py): Levenberg-Marquardt, then MCMC.
// One warp per voxel: the lanes share the voxel's M measurements (lane l takes
// m = l, l + 32, ...) and reduce sums with shuffles; everything else is computed
// redundantly and identically by all 32 lanes (same parameters, same random
// numbers), so the warp never diverges and needs no broadcasts.
//
// Compile-time constants (set by gpu/ballstick.py):
//   NFIB      sticks per voxel (1..3)
//   PER_LANE  measurements per lane, ceil(M / 32) (MCMC only: held in registers; 1 for LM)
//   RICIAN    1 for Rician noise (adds the precision tau), 0 for Gaussian (0 for LM)
//   MODEL2    1 for model 2 (gamma-distributed diffusivities: adds d_std after the sticks), 0 for
//             model 1 (0 for LM: the least-squares fit is model 1's)
//
// Internal units: signal / S0 of the tensor fit, b / max(b), d * max(b).
// philox4x32_10 comes from philox.cuh (prepended by gpu/cuda.py).

#ifndef NFIB
#error "NFIB is a compile-time constant defined by gpu/ballstick.py"
#endif
#ifndef PER_LANE
#error "PER_LANE is a compile-time constant defined by gpu/ballstick.py"
#endif
#ifndef RICIAN
#error "RICIAN is a compile-time constant defined by gpu/ballstick.py"
#endif
#ifndef MODEL2
#error "MODEL2 is a compile-time constant defined by gpu/ballstick.py"
#endif
#define FULL_MASK 0xffffffffu
#define NPL (2 + 3 * NFIB)  // parameters of the least-squares fit
#define NP (NPL + MODEL2 + RICIAN)  // parameters of the MCMC: ..., sticks, [d_std,] [tau]
#define IDSTD NPL  // where d_std sits (model 2)

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return __shfl_sync(FULL_MASK, v, 0);  // the butterfly already agrees; make it explicit
}

__device__ __forceinline__ double warp_sum_d(double v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return __shfl_sync(FULL_MASK, v, 0);
}

// ---------------------------------------------------------------- Levenberg-Marquardt
// x = (s0, u, (theta, phi, q) per stick); d = exp(u), f_i = q_i^2 / (1 + sum q^2).

struct Model {
    float s0, bd_scale, ballf;
    float f[NFIB], q[NFIB], vx[NFIB], vy[NFIB], vz[NFIB];
    float tx[NFIB], ty[NFIB], tz[NFIB], px[NFIB], py[NFIB];  // dv/dtheta, dv/dphi (pz = 0)
    float qscale;                                          // 2 s0 / (1 + Q)
};

__device__ __forceinline__ Model make_model(const double* x) {
    Model mo;
    mo.s0 = (float)x[0];
    mo.bd_scale = (float)exp(x[1]);
    double Q = 0.0;
#pragma unroll
    for (int i = 0; i < NFIB; ++i) Q += x[4 + 3 * i] * x[4 + 3 * i];
    float fsum = 0.f;
#pragma unroll
    for (int i = 0; i < NFIB; ++i) {
        double q = x[4 + 3 * i];
        mo.q[i] = (float)q;
        mo.f[i] = (float)(q * q / (1.0 + Q));
        fsum += mo.f[i];
        float st, ct, sp, cp;
        sincosf((float)x[2 + 3 * i], &st, &ct);
        sincosf((float)x[3 + 3 * i], &sp, &cp);
        mo.vx[i] = st * cp; mo.vy[i] = st * sp; mo.vz[i] = ct;
        mo.tx[i] = ct * cp; mo.ty[i] = ct * sp; mo.tz[i] = -st;
        mo.px[i] = -st * sp; mo.py[i] = st * cp;
    }
    mo.ballf = 1.f - fsum;
    mo.qscale = (float)(2.0 * x[0] / (1.0 + Q));
    return mo;
}

// Signal of one measurement; with jac != nullptr also its NPL derivatives.
__device__ __forceinline__ float model_signal(const Model& mo, float b, float gx, float gy, float gz, float* jac) {
    float bd = b * mo.bd_scale;
    float ball = __expf(-bd);
    float mix = mo.ballf * ball, mixc = mo.ballf * ball, common = 0.f;
    float c[NFIB], e[NFIB];
#pragma unroll
    for (int i = 0; i < NFIB; ++i) {
        c[i] = gx * mo.vx[i] + gy * mo.vy[i] + gz * mo.vz[i];
        e[i] = __expf(-bd * c[i] * c[i]);
        mix += mo.f[i] * e[i];
        mixc += mo.f[i] * c[i] * c[i] * e[i];
        common += mo.f[i] * (e[i] - ball);
    }
    if (jac) {
        jac[0] = mix;
        jac[1] = -mo.s0 * bd * mixc;
#pragma unroll
        for (int i = 0; i < NFIB; ++i) {
            float k = -2.f * mo.s0 * mo.f[i] * e[i] * bd * c[i];
            jac[2 + 3 * i] = k * (gx * mo.tx[i] + gy * mo.ty[i] + gz * mo.tz[i]);
            jac[3 + 3 * i] = k * (gx * mo.px[i] + gy * mo.py[i]);
            jac[4 + 3 * i] = mo.qscale * mo.q[i] * ((e[i] - ball) - common);
        }
    }
    return mo.s0 * mix;
}

// Fill J (m x NPL) and r (m) of this warp's voxel in shared memory; return the sum of squares.
__device__ double lm_residuals(const double* x, const float* __restrict__ y, const float* __restrict__ bvals,
                               const float* __restrict__ bvecs, int m, float* J, float* r, int lane) {
    Model mo = make_model(x);
    double ss = 0.0;
    for (int k = lane; k < m; k += 32) {
        float s = model_signal(mo, bvals[k], bvecs[3 * k], bvecs[3 * k + 1], bvecs[3 * k + 2], J + k * NPL);
        float res = y[k] - s;
        r[k] = res;
        ss += (double)res * res;
    }
    return warp_sum_d(ss);
}

__device__ double lm_cost(const double* x, const float* __restrict__ y, const float* __restrict__ bvals,
                          const float* __restrict__ bvecs, int m, int lane) {
    Model mo = make_model(x);
    double ss = 0.0;
    for (int k = lane; k < m; k += 32) {
        float res = y[k] - model_signal(mo, bvals[k], bvecs[3 * k], bvecs[3 * k + 1], bvecs[3 * k + 2], nullptr);
        ss += (double)res * res;
    }
    return warp_sum_d(ss);
}

#define NTRI (NPL * (NPL + 1) / 2)

// Per warp, dynamic shared memory: NTRI + 2 NPL doubles (JtJ, Jtr, step), then m (NPL + 1) floats (J, r).
extern "C" __global__ void ballstick_lm(const float* __restrict__ y_all, const float* __restrict__ bvals,
                                        const float* __restrict__ bvecs, const double* __restrict__ x0,
                                        long long n, int m, int iterations, double lambda0, double lambda_stop,
                                        double* __restrict__ x_out, double* __restrict__ cost_out) {
    extern __shared__ double shared[];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    long long v = (long long)blockIdx.x * (blockDim.x >> 5) + warp;
    if (v >= n) return;
    size_t per_warp_doubles = NTRI + 2 * NPL + ((size_t)m * (NPL + 1) + 1) / 2;
    double* H = shared + warp * per_warp_doubles;
    double* g = H + NTRI;
    double* step = g + NPL;
    float* J = (float*)(step + NPL);
    float* r = J + (size_t)m * NPL;
    const float* y = y_all + v * m;

    double x[NPL];
#pragma unroll
    for (int p = 0; p < NPL; ++p) x[p] = x0[v * NPL + p];
    double lam = lambda0;
    double cost = lm_residuals(x, y, bvals, bvecs, m, J, r, lane);
    __syncwarp();
    bool fresh = true;  // J, r belong to x and the normal equations must be formed
    for (int it = 0; it < iterations && lam <= lambda_stop; ++it) {
        if (fresh) {
            for (int e = lane; e < NTRI + NPL; e += 32) {
                double acc = 0.0;
                if (e < NTRI) {
                    int i = 0, rem = e;  // packed upper triangle, row by row
                    while (rem >= NPL - i) { rem -= NPL - i; ++i; }
                    int j = i + rem;
                    for (int k = 0; k < m; ++k) acc += (double)J[k * NPL + i] * J[k * NPL + j];
                    H[e] = acc;
                } else {
                    int i = e - NTRI;
                    for (int k = 0; k < m; ++k) acc += (double)J[k * NPL + i] * r[k];
                    g[i] = acc;
                }
            }
            __syncwarp();
            fresh = false;
        }
        int ok = 0;
        if (lane == 0) {
            // Cholesky of A = JtJ + (lam diag + 1e-12) I, then two triangular solves.
            double L[NPL][NPL];
            int e = 0;
            for (int i = 0; i < NPL; ++i)
                for (int j = i; j < NPL; ++j, ++e) L[j][i] = H[e] + (i == j ? lam * H[e] + 1e-12 : 0.0);
            ok = 1;
            for (int j = 0; j < NPL && ok; ++j) {
                double s = L[j][j];
                for (int k = 0; k < j; ++k) s -= L[j][k] * L[j][k];
                if (!(s > 0.0) || !isfinite(s)) { ok = 0; break; }
                L[j][j] = sqrt(s);
                for (int i = j + 1; i < NPL; ++i) {
                    double t = L[i][j];
                    for (int k = 0; k < j; ++k) t -= L[i][k] * L[j][k];
                    L[i][j] = t / L[j][j];
                }
            }
            if (ok) {
                double z[NPL];
                for (int i = 0; i < NPL; ++i) {
                    double t = g[i];
                    for (int k = 0; k < i; ++k) t -= L[i][k] * z[k];
                    z[i] = t / L[i][i];
                }
                for (int i = NPL - 1; i >= 0; --i) {
                    double t = z[i];
                    for (int k = i + 1; k < NPL; ++k) t -= L[k][i] * step[k];
                    step[i] = t / L[i][i];
                    if (!isfinite(step[i])) ok = 0;
                }
            }
        }
        ok = __shfl_sync(FULL_MASK, ok, 0);
        __syncwarp();
        double trial[NPL];
#pragma unroll
        for (int p = 0; p < NPL; ++p) trial[p] = x[p] + (ok ? step[p] : 0.0);
        double trial_cost = ok ? lm_cost(trial, y, bvals, bvecs, m, lane) : cost;
        if (ok && trial_cost < cost) {
#pragma unroll
            for (int p = 0; p < NPL; ++p) x[p] = trial[p];
            __syncwarp();
            cost = lm_residuals(x, y, bvals, bvecs, m, J, r, lane);
            __syncwarp();
            lam *= 0.1;
            fresh = true;
        } else {
            lam *= 10.0;
        }
    }
    if (lane < NPL) {
        double value = x[0];
#pragma unroll
        for (int p = 1; p < NPL; ++p)
            if (lane == p) value = x[p];
        x_out[v * NPL + lane] = value;
    }
    if (lane == 0) cost_out[v] = cost;
}

// ---------------------------------------------------------------- MCMC

__device__ __forceinline__ float unit_open(unsigned int r) {  // (r + 1/2) / 2^32
    return fmaf((float)r, 2.3283064365386963e-10f, 1.1641532182693481e-10f);
}

// Rician energy of one measurement: tau/2 (y^2 + S^2) - log I0(tau y S) (see rician_terms in gpu/ballstick.py).
__device__ __forceinline__ float rician_term(float y, float s, float tau) {
    float x = tau * fabsf(y * s);
    if (x < 3.75f) {
        float t = x * (1.f / 3.75f);
        t *= t;
        float i0 = 0.0045813f;
        i0 = fmaf(i0, t, 0.0360768f); i0 = fmaf(i0, t, 0.2659732f); i0 = fmaf(i0, t, 1.2067492f);
        i0 = fmaf(i0, t, 3.0899424f); i0 = fmaf(i0, t, 3.5156229f); i0 = fmaf(i0, t, 1.0f);
        return 0.5f * tau * (y * y + s * s) - logf(i0);
    }
    float t = 3.75f / x;
    float p = 0.00392377f;
    p = fmaf(p, t, -0.01647633f); p = fmaf(p, t, 0.02635537f); p = fmaf(p, t, -0.02057706f);
    p = fmaf(p, t, 0.00916281f); p = fmaf(p, t, -0.00157565f); p = fmaf(p, t, 0.00225319f);
    p = fmaf(p, t, 0.01328592f); p = fmaf(p, t, 0.39894228f);
    float dy = fabsf(y) - fabsf(s);
    return 0.5f * tau * dy * dy + 0.5f * logf(x) - logf(p);
}

__device__ __forceinline__ float likelihood_energy(float sum, float tau, int m) {
#if RICIAN
    return -(float)m * logf(tau) + sum;
#else
    return 0.5f * (float)m * logf(fmaxf(sum, 1e-30f) * 0.5f);
#endif
}

__device__ __forceinline__ float residual_term(float y, float s, float tau) {
#if RICIAN
    return rician_term(y, s, tau);
#else
    float r = y - s;
    return r * r;
#endif
}

__device__ __forceinline__ float theta_prior(float th) { return -logf(fmaxf(fabsf(sinf(th)), 1e-30f)); }

// ln(1 + x) for x >= 0, fast: three terms of the series below 1/64 (error below x^4/4, 1e-7 of the
// value), the hardware logarithm of 1 + x above (absolute error about 2^-22, where the value is
// at least 0.0155). log1pf, accurate to the last bit, is a long software routine: with it the
// model-2 chain took 20 times as long as model 1's, whose terms are one hardware exponential.
__device__ __forceinline__ float fast_log1p(float x) {
    return x < 0.015625f ? x * (1.f - x * (0.5f - x * (1.f / 3.f))) : __logf(1.f + x);
}

// Model 2: the gamma model's (1 + b c^2 s^2 / d)^(-d^2 / s^2) (compartment_signal in gpu/ballstick.py).
__device__ __forceinline__ float gamma_term(float bc2, float d, float dstd) {
    float r = d / dstd;
    return __expf(-(r * r) * fast_log1p(bc2 * dstd * dstd / d));
}

// The ball's signal at b-value b (model 1: exp(-b d)).
__device__ __forceinline__ float ball_term(float b, float d, float dstd) {
#if MODEL2
    return gamma_term(b, d, dstd);
#else
    return __expf(-(b * d));
#endif
}

// A stick's signal at b-value b with c = g.v (model 1: exp(-b d c^2)).
__device__ __forceinline__ float stick_term(float b, float c, float d, float dstd) {
#if MODEL2
    return gamma_term(b * c * c, d, dstd);
#else
    float bd = b * d;
    return __expf(-bd * c * c);
#endif
}

extern "C" __global__ void __launch_bounds__(256) ballstick_mcmc(
    const float* __restrict__ y_all, const float* __restrict__ bvals, const float* __restrict__ bvecs,
    const float* __restrict__ init, long long n, int m, unsigned long long voxel0, unsigned int key0,
    unsigned int key1, int burnin, int njumps, int sample_every, int n_samples, int update_every, float ard_weight,
    float d_max, float d_std_max, float* __restrict__ samples, float* __restrict__ acceptance) {
    __shared__ float sb[32 * PER_LANE], sgx[32 * PER_LANE], sgy[32 * PER_LANE], sgz[32 * PER_LANE];
    for (int k = threadIdx.x; k < 32 * PER_LANE; k += blockDim.x) {
        bool in = k < m;
        sb[k] = in ? bvals[k] : 0.f;
        sgx[k] = in ? bvecs[3 * k] : 0.f;
        sgy[k] = in ? bvecs[3 * k + 1] : 0.f;
        sgz[k] = in ? bvecs[3 * k + 2] : 0.f;
    }
    __syncthreads();
    int lane = threadIdx.x & 31;
    long long v = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (v >= n) return;

    float y[PER_LANE];
#pragma unroll
    for (int j = 0; j < PER_LANE; ++j) {
        int k = lane + 32 * j;
        y[j] = k < m ? y_all[v * m + k] : 0.f;
    }
    const float* x0 = init + v * NP;
    float s0 = x0[0], d = x0[1];
    float th[NFIB], ph[NFIB], f[NFIB], vx[NFIB], vy[NFIB], vz[NFIB];
    float fsum = 0.f;
#pragma unroll
    for (int i = 0; i < NFIB; ++i) {
        th[i] = x0[2 + 3 * i]; ph[i] = x0[3 + 3 * i]; f[i] = x0[4 + 3 * i];
        fsum += f[i];
        float st, ct, sp, cp;
        sincosf(th[i], &st, &ct);
        sincosf(ph[i], &sp, &cp);
        vx[i] = st * cp; vy[i] = st * sp; vz[i] = ct;
    }
    float tau = RICIAN ? x0[NP - 1] : 1.f;
    float dstd = MODEL2 ? x0[IDSTD] : 0.f;

    // Cached compartment signals: ball exp(-b d) and sticks exp(-b d (g.v_i)^2) per measurement
    // (or model 2's gamma counterparts).
    float e0[PER_LANE], E[NFIB][PER_LANE];
#pragma unroll
    for (int j = 0; j < PER_LANE; ++j) {
        int k = lane + 32 * j;
        e0[j] = ball_term(sb[k], d, dstd);
#pragma unroll
        for (int i = 0; i < NFIB; ++i) {
            float c = sgx[k] * vx[i] + sgy[k] * vy[i] + sgz[k] * vz[i];
            E[i][j] = stick_term(sb[k], c, d, dstd);
        }
    }

    float prior = 0.f;
#pragma unroll
    for (int i = 0; i < NFIB; ++i) {
        prior += theta_prior(th[i]);
        if (i > 0 && ard_weight > 0.f) prior += ard_weight * logf(f[i]);
    }
    if (MODEL2) prior += logf(dstd);  // FSL's 1/d_std prior
    float lik;
    {
        float sum = 0.f;
#pragma unroll
        for (int j = 0; j < PER_LANE; ++j) {
            float mix = (1.f - fsum) * e0[j];
#pragma unroll
            for (int i = 0; i < NFIB; ++i) mix += f[i] * E[i][j];
            if (lane + 32 * j < m) sum += residual_term(y[j], s0 * mix, tau);
        }
        lik = likelihood_energy(warp_sum(sum), tau, m);
    }
    float energy = lik + prior;

    float prop[NP];
    int acc[NP], rej[NP];
    prop[0] = s0 * 0.1f;
    prop[1] = d * 0.1f;
#pragma unroll
    for (int p = 2; p < NPL; ++p) prop[p] = 0.2f;
#if MODEL2
    prop[IDSTD] = dstd * 0.1f;
#endif
    if (RICIAN) prop[NP - 1] = tau * 0.5f;
#pragma unroll
    for (int p = 0; p < NP; ++p) { acc[p] = 0; rej[p] = 0; }

    const unsigned int vlo = (unsigned int)(voxel0 + v), vhi = (unsigned int)((voxel0 + v) >> 32);
    const int total = burnin + njumps;
    for (int it = 0; it < total; ++it) {
#pragma unroll
        for (int p = 0; p < NP; ++p) {
            uint4 r = philox4x32_10(make_uint4((unsigned int)(it * NP + p), 0u, vlo, vhi), key0, key1);
            float normal = sqrtf(-2.f * logf(unit_open(r.x))) * cospif(2.f * unit_open(r.y));
            float log_u = logf(unit_open(r.z));
            float step = normal * prop[p];
            // Which parameter: 0 S0, 1 d, 2.. (theta, phi, f) per stick, IDSTD d_std (model 2),
            // NP-1 tau (Rician).
            int stick = (p - 2) / 3, what = (p - 2) % 3;  // what: 0 theta, 1 phi, 2 f
            bool is_stick = p >= 2 && p < NPL;
            bool is_dstd = MODEL2 && p == IDSTD;
            bool all_terms = p == 1 || is_dstd;  // every compartment's signal changes
            float s0n = s0, dn = d, dstdn = dstd, taun = tau, fn = 0.f, thn = 0.f, phn = 0.f;
            float nvx = 0.f, nvy = 0.f, nvz = 0.f;
            bool valid = true;
            float prior_new = prior;
            if (p == 0) { s0n = s0 + step; valid = s0n > 0.f; }
            else if (p == 1) { dn = d + step; valid = dn > 0.f && (!MODEL2 || dn <= d_max); }
            else if (is_dstd) {
                dstdn = dstd + step;
                valid = dstdn > 0.f && dstdn <= d_std_max;
                if (valid) prior_new += logf(dstdn) - logf(dstd);
            }
            else if (RICIAN && p == NP - 1) { taun = tau + step; valid = taun > 0.f; }
            else if (is_stick && what == 2) {
                fn = f[stick] + step;
                valid = fn > 0.f && fn < 1.f && fsum - f[stick] + fn <= 1.f;
                if (valid && stick > 0 && ard_weight > 0.f) prior_new += ard_weight * (logf(fn) - logf(f[stick]));
            } else if (is_stick) {
                thn = th[stick] + (what == 0 ? step : 0.f);
                phn = ph[stick] + (what == 1 ? step : 0.f);
                float st, ct, sp, cp;
                sincosf(thn, &st, &ct);
                sincosf(phn, &sp, &cp);
                nvx = st * cp; nvy = st * sp; nvz = ct;
                if (what == 0) prior_new += theta_prior(thn) - theta_prior(th[stick]);
            }
            bool accept = false;
            if (valid) {  // warp-uniform
                float fsumn = (is_stick && what == 2) ? fsum - f[stick] + fn : fsum;
                float sum = 0.f;
#pragma unroll
                for (int j = 0; j < PER_LANE; ++j) {
                    int k = lane + 32 * j;
                    float mix;
                    if (all_terms) {
                        mix = (1.f - fsum) * ball_term(sb[k], dn, dstdn);
#pragma unroll
                        for (int i = 0; i < NFIB; ++i) {
                            float c = sgx[k] * vx[i] + sgy[k] * vy[i] + sgz[k] * vz[i];
                            mix += f[i] * stick_term(sb[k], c, dn, dstdn);
                        }
                    } else {
                        mix = (1.f - fsumn) * e0[j];
#pragma unroll
                        for (int i = 0; i < NFIB; ++i) {
                            float fi = f[i], ei = E[i][j];
                            if (is_stick && i == stick) {
                                if (what == 2) fi = fn;
                                else {
                                    float c = sgx[k] * nvx + sgy[k] * nvy + sgz[k] * nvz;
                                    ei = stick_term(sb[k], c, d, dstd);
                                }
                            }
                            mix += fi * ei;
                        }
                    }
                    if (k < m) sum += residual_term(y[j], s0n * mix, taun);
                }
                float lik_new = likelihood_energy(warp_sum(sum), taun, m);
                float energy_new = lik_new + prior_new;
                accept = log_u < energy - energy_new;
                if (accept) { energy = energy_new; prior = prior_new; }
            }
            if (accept) {
                acc[p]++;
                if (p == 0) s0 = s0n;
                else if (p == 1) d = dn;
                else if (is_dstd) dstd = dstdn;
                else if (RICIAN && p == NP - 1) tau = taun;
                else if (what == 2) { fsum += fn - f[stick]; f[stick] = fn; }
                else { th[stick] = thn; ph[stick] = phn; vx[stick] = nvx; vy[stick] = nvy; vz[stick] = nvz; }
                if (all_terms || (is_stick && what != 2)) {  // refresh the cached compartment signals
#pragma unroll
                    for (int j = 0; j < PER_LANE; ++j) {
                        int k = lane + 32 * j;
                        if (all_terms) e0[j] = ball_term(sb[k], d, dstd);
#pragma unroll
                        for (int i = 0; i < NFIB; ++i) {
                            if (all_terms || i == stick) {
                                float c = sgx[k] * vx[i] + sgy[k] * vy[i] + sgz[k] * vz[i];
                                E[i][j] = stick_term(sb[k], c, d, dstd);
                            }
                        }
                    }
                }
            } else {
                rej[p]++;
            }
        }
        if (it < burnin) {
            if ((it + 1) % update_every == 0) {
#pragma unroll
                for (int p = 0; p < NP; ++p) {
                    prop[p] *= sqrtf((float)(acc[p] + 1) / (float)(rej[p] + 1));
                    acc[p] = 0; rej[p] = 0;
                }
            }
            if (it + 1 == burnin) {
#pragma unroll
                for (int p = 0; p < NP; ++p) { acc[p] = 0; rej[p] = 0; }
            }
        } else {
            int t = it - burnin + 1;
            if (t % sample_every == 0 && t / sample_every <= n_samples && lane == 0) {
                int s = t / sample_every - 1;
                float* out = samples + (size_t)v * NP * n_samples + s;
                out[0] = s0;
                out[n_samples] = d;
#pragma unroll
                for (int i = 0; i < NFIB; ++i) {
                    out[(2 + 3 * i) * n_samples] = th[i];
                    out[(3 + 3 * i) * n_samples] = ph[i];
                    out[(4 + 3 * i) * n_samples] = f[i];
                }
                if (MODEL2) out[IDSTD * n_samples] = dstd;
                if (RICIAN) out[(NP - 1) * n_samples] = tau;
            }
        }
    }
    if (lane == 0) {
#pragma unroll
        for (int p = 0; p < NP; ++p) acceptance[v * NP + p] = (float)acc[p] / (float)max(acc[p] + rej[p], 1);
    }
}
