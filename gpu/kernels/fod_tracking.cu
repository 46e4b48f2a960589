typedef float real;  // fODF tracking in float32 (the precision of sym3.cuh and tracking.cuh here)

// fODF tractography, one thread per streamline: deterministic (SD_STREAM, the peak nearest the
// incoming direction) and probabilistic (iFOD1, rejection sampling in the cone of the max
// angle). gpu/fod_tracking.py has the rules and the array-operations reference this kernel
// reproduces step by step. The field holds, per voxel, the 45 coefficients of the fODF as a
// homogeneous polynomial of degree 8 in the voxel axes (monomials x^a y^b z^(8-a-b), a outer,
// b inner), padded to 48 floats: 12 float4 loads per corner.

#ifndef MAX_LENGTH
#error "MAX_LENGTH is a compile-time constant defined by gpu/fod_tracking.py"
#endif
#ifndef OUTSIDE_VOLUME
#error "OUTSIDE_VOLUME is a compile-time constant defined by gpu/fod_tracking.py"
#endif
#ifndef OUTSIDE_MASK
#error "OUTSIDE_MASK is a compile-time constant defined by gpu/fod_tracking.py"
#endif
#ifndef LOW_FA
#error "LOW_FA is a compile-time constant defined by gpu/fod_tracking.py"
#endif
#ifndef SHARP_ANGLE
#error "SHARP_ANGLE is a compile-time constant defined by gpu/fod_tracking.py"
#endif
#ifndef STOP_REGION
#error "STOP_REGION is a compile-time constant defined by gpu/fod_tracking.py"
#endif
#ifndef REGION_OUTSIDE
#error "REGION_OUTSIDE is a compile-time constant defined by gpu/fod_tracking.py"
#endif
#ifndef REGION_STOP
#error "REGION_STOP is a compile-time constant defined by gpu/fod_tracking.py"
#endif
#ifndef N_SEED_DIRECTIONS
#error "N_SEED_DIRECTIONS is a compile-time constant defined by gpu/fod_tracking.py"
#endif
#ifndef PEAK_ITERATIONS
#error "PEAK_ITERATIONS is a compile-time constant defined by gpu/fod_tracking.py"
#endif
#ifndef P_SEED
#error "P_SEED is a compile-time constant defined by gpu/fod_tracking.py"
#endif
#ifndef P_STEP
#error "P_STEP is a compile-time constant defined by gpu/fod_tracking.py"
#endif

// The real-valued constants of the ascent and the sampler (gpu/fod_tracking.py's).
struct Shape {
    float secant_rad, max_newton_rad, envelope_margin;
};

__device__ __forceinline__ void powers9(float v, float p[9]) {
    p[0] = 1.0f;
#pragma unroll
    for (int k = 1; k < 9; ++k) p[k] = p[k - 1] * v;
}

__device__ __forceinline__ float fod_amplitude(const float c[48], R3 u) {
    float px[9], py[9], pz[9];
    powers9(u.x, px); powers9(u.y, py); powers9(u.z, pz);
    float total = 0.0f;
    int k = 0;
#pragma unroll
    for (int a = 0; a <= 8; ++a)
#pragma unroll
        for (int b = 0; b <= 8 - a; ++b, ++k) total += c[k] * (px[a] * py[b] * pz[8 - a - b]);
    return total;
}

__device__ __forceinline__ R3 fod_gradient(const float c[48], R3 u) {
    float px[9], py[9], pz[9];
    powers9(u.x, px); powers9(u.y, py); powers9(u.z, pz);
    float gx = 0.0f, gy = 0.0f, gz = 0.0f;
    int k = 0;
#pragma unroll
    for (int a = 0; a <= 8; ++a)
#pragma unroll
        for (int b = 0; b <= 8 - a; ++b, ++k) {
            const int cc = 8 - a - b;
            const float w = c[k];
            if (a) gx += w * (a * px[a - 1] * py[b] * pz[cc]);
            if (b) gy += w * (b * px[a] * py[b - 1] * pz[cc]);
            if (cc) gz += w * (cc * px[a] * py[b] * pz[cc - 1]);
        }
    return r3(gx, gy, gz);
}

__device__ __forceinline__ R3 unit_or(R3 v, R3 fallback) {
    float n = sqrtf(dot3r(v, v));
    return n > 0.0f ? scale3r(v, 1.0f / n) : fallback;
}

// Newton ascent along great circles from u (gpu/fod_tracking.py: nearest_peak).
__device__ R3 nearest_peak(const float c[48], R3 u, int iterations, const Shape& s, float* amp) {
    const float cs = cosf(s.secant_rad), sn = sinf(s.secant_rad);
    for (int it = 0; it < iterations; ++it) {
        R3 g = fod_gradient(c, u);
        R3 tangent = add3r(g, scale3r(u, -dot3r(g, u)));
        float slope = sqrtf(dot3r(tangent, tangent));
        if (!(slope > 1e-12f)) continue;
        R3 t = scale3r(tangent, 1.0f / slope);
        R3 w = add3r(scale3r(u, cs), scale3r(t, sn));
        float slope_w = dot3r(fod_gradient(c, w), add3r(scale3r(t, cs), scale3r(u, -sn)));
        float curvature = (slope_w - slope) / s.secant_rad;
        float step = curvature < 0.0f ? -slope / curvature : s.max_newton_rad;
        step = fminf(fmaxf(step, 0.0f), s.max_newton_rad);
        u = unit_or(add3r(scale3r(u, cosf(step)), scale3r(t, sinf(step))), u);
    }
    *amp = fod_amplitude(c, u);
    return u;
}

// The best of the seed directions, then the ascent (largest_peak).
__device__ R3 largest_peak(const float c[48], const float* __restrict__ dirs, const Shape& s, float* amp) {
    int best = 0;
    float best_value = -3.402823466e38f;
    for (int k = 0; k < N_SEED_DIRECTIONS; ++k) {
        float value = fod_amplitude(c, r3(dirs[3 * k], dirs[3 * k + 1], dirs[3 * k + 2]));
        if (value > best_value) { best_value = value; best = k; }
    }
    R3 start = r3(dirs[3 * best], dirs[3 * best + 1], dirs[3 * best + 2]);
    return nearest_peak(c, start, PEAK_ITERATIONS + 2, s, amp);
}

// A 23-bit uniform in (0, 1), exact in float32 and float64 alike (_uniforms).
__device__ __forceinline__ float uniform23(unsigned int x) {
    return ((float)(x >> 9) + 0.5f) * 1.1920928955078125e-07f;
}

// A direction in the cone of cos_max about v, drawn ∝ amplitude^power under `envelope`
// (draw_in_cone); *ok says whether a draw was accepted (else v comes back).
__device__ R3 draw_in_cone(const float c[48], R3 v, float envelope, float cos_max, float cutoff, float power,
                           int max_trials, unsigned int step, unsigned int word1, unsigned long long sid,
                           unsigned int k0, unsigned int k1, bool* ok) {
    R3 axis = fabsf(v.x) < 0.9f ? r3(1.0f, 0.0f, 0.0f) : r3(0.0f, 1.0f, 0.0f);
    R3 t1 = add3r(axis, scale3r(v, -dot3r(axis, v)));
    t1 = scale3r(t1, 1.0f / sqrtf(dot3r(t1, t1)));
    R3 t2 = cross3r(v, t1);
    const float bound = powf(envelope, power);
    for (int trial = 0; trial < max_trials; ++trial) {
        uint4 r = philox4x32_10(make_uint4(step, word1 + (unsigned int)trial, (unsigned int)(sid & 0xFFFFFFFFull),
                                           (unsigned int)(sid >> 32)), k0, k1);
        float u1 = uniform23(r.x), u2 = uniform23(r.y), u3 = uniform23(r.z);
        float cos_t = 1.0f - u1 * (1.0f - cos_max);
        float sin_t = sqrtf(fmaxf(1.0f - cos_t * cos_t, 0.0f));
        float phi = 6.283185307179586f * u2;
        R3 around = add3r(scale3r(t1, cosf(phi)), scale3r(t2, sinf(phi)));
        R3 cand = add3r(scale3r(v, cos_t), scale3r(around, sin_t));
        float a = fod_amplitude(c, cand);
        if (a >= cutoff && u3 * bound < powf(fmaxf(a, 0.0f), power)) {
            *ok = true;
            return cand;
        }
    }
    *ok = false;
    return v;
}

// The fODF trackers' part of the walk (walk.cuh): Euler steps along the fODF peak nearest the
// incoming direction (SD_STREAM) or a direction drawn in the cone (iFOD1), stopping where the
// fODF falls below the cut-off, on a sharp turn or when no draw was accepted.
struct FodStep {
    const float4* field;
    Grid g;
    Shape s;
    unsigned long long sid;
    float cutoff, cos_max, power, envelope_margin;
    int max_trials;
    unsigned int k0, k1;
    bool probabilistic;

    __device__ R3 advance(R3, R3 d) const { return d; }

    __device__ unsigned char turn(R3 q, R3 d, int end, int steps, R3* e) const {
        float c[48], amp;
        trilinear_f4<12, 12>(field, g, q, c);
        *e = nearest_peak(c, d, PEAK_ITERATIONS, s, &amp);
        if (amp < cutoff) return LOW_FA;
        if (probabilistic) {
            bool ok;
            *e = draw_in_cone(c, d, envelope_margin * amp, cos_max, cutoff, power, max_trials, (unsigned int)steps,
                              ((unsigned int)P_STEP << 24) | ((unsigned int)end << 16), sid, k0, k1, &ok);
            if (!ok) return SHARP_ANGLE;
        } else if (dot3r(*e, d) < cos_max) {
            return SHARP_ANGLE;
        }
        return 0;
    }
};

extern "C" __global__ void track_fod(
    const float4* __restrict__ field, const unsigned char* __restrict__ region, int nx, int ny, int nz,
    const double* __restrict__ seeds, int n, unsigned long long first_id, float hx, float hy, float hz,
    float cutoff, float cos_max, int m, int probabilistic, float power, int max_trials, unsigned int k0,
    unsigned int k1, float secant_rad, float max_newton_rad, float envelope_margin,
    const float* __restrict__ seed_dirs, float* __restrict__ buf, int* __restrict__ count,
    unsigned char* __restrict__ stop, unsigned char* __restrict__ valid) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const Shape s = {secant_rad, max_newton_rad, envelope_margin};
    const unsigned long long sid = first_id + (unsigned long long)i;
    Grid g;
    g.nx = nx; g.ny = ny; g.nz = nz;
    const R3 h = r3(hx, hy, hz);
    float* row = buf + (size_t)i * (size_t)(2 * m + 1) * 3;
    R3 p0 = r3((float)seeds[3 * i], (float)seeds[3 * i + 1], (float)seeds[3 * i + 2]);
    unsigned char seed_stop = start_row(row, m, p0, region, g, count + 2 * i);
    valid[i] = seed_stop == 0;
    float c[48];
    float amp = 0.0f;
    R3 d0 = r3(1.0f, 0.0f, 0.0f);
    if (seed_stop == 0) {
        trilinear_f4<12, 12>(field, g, p0, c);
        d0 = largest_peak(c, seed_dirs, s, &amp);
        if (amp < cutoff) seed_stop = LOW_FA;
    }
    if (seed_stop) {
        stop[2 * i] = seed_stop;
        stop[2 * i + 1] = seed_stop;
        return;
    }
    if (probabilistic) {
        bool ok;
        R3 drawn = draw_in_cone(c, d0, envelope_margin * amp, -1.0f, cutoff, power, max_trials, 0u,
                                (unsigned int)P_SEED << 24, sid, k0, k1, &ok);
        if (ok) d0 = drawn;
    }
    const FodStep method = {field, g, s, sid, cutoff, cos_max, power, envelope_margin, max_trials, k0, k1,
                            probabilistic != 0};
    walk_halves(method, p0, d0, h, m, row, region, g, count + 2 * i, stop + 2 * i);
}
