typedef float real;  // the precision of sym3.cuh and tracking.cuh here (see gpu/cuda.py)

// Geodesic ray tracing; gpu/geodesic.py has the rules and the array-operations reference
// this kernel reproduces (in float32).
//
// Field: 64 bytes per voxel (four 16-byte chunks): C as 6 float32, then the 18
// derivatives dG/dx, dG/dy, dG/dz (mm) as float16 multiplied by a power of two
// (`inv_scale` undoes it), then 4 bytes of padding. Positions are integrated in mm along
// the voxel axes; lookups use voxel coordinates.
//
// Speed comes from three things (measured in tests/benchmarks/bench_geodesic.py):
// - a per-thread cell cache in shared memory: the 8 voxels around the thread's current
//   cell, refilled with cp.async (one round trip, no registers held) only when the
//   fibre enters another cell, which at 0.1-voxel steps is every ~5th evaluation. Without
//   it the L1 cache thrashes between the fibres resident on an SM;
// - persistent threads: each thread takes the next fibre from a global counter when its
//   fibre ends, so warps stay full until the work runs out;
// - the metric of the connectivity measure is taken where RK2 and RK4 evaluate their
//   second stage (x + h/2 v), which costs no extra lookup.

// Stop codes (gpu/streamlines.py), region bits and CHUNKS, the 16-byte chunks per voxel of
// the field, passed by gpu/geodesic.py.
#ifndef OUTSIDE_VOLUME
#error "OUTSIDE_VOLUME is a compile-time constant defined by gpu/geodesic.py"
#endif
#ifndef TOLERANCE_SLACK_MICROSTEPS
#error "TOLERANCE_SLACK_MICROSTEPS is a compile-time constant defined by gpu/geodesic.py"
#endif
#ifndef OUTSIDE_MASK
#error "OUTSIDE_MASK is a compile-time constant defined by gpu/geodesic.py"
#endif
#ifndef LOW_FA
#error "LOW_FA is a compile-time constant defined by gpu/geodesic.py"
#endif
#ifndef SHARP_ANGLE
#error "SHARP_ANGLE is a compile-time constant defined by gpu/geodesic.py"
#endif
#ifndef MAX_LENGTH
#error "MAX_LENGTH is a compile-time constant defined by gpu/geodesic.py"
#endif
#ifndef MAX_STEPS
#error "MAX_STEPS is a compile-time constant defined by gpu/geodesic.py"
#endif
#ifndef REACHED_TARGET
#error "REACHED_TARGET is a compile-time constant defined by gpu/geodesic.py"
#endif
#ifndef TRACK_BIT
#error "TRACK_BIT is a compile-time constant defined by gpu/geodesic.py"
#endif
#ifndef TARGET_BIT
#error "TARGET_BIT is a compile-time constant defined by gpu/geodesic.py"
#endif
#ifndef CHUNKS
#error "CHUNKS is a compile-time constant defined by gpu/geodesic.py"
#endif

extern __shared__ uint4 cell_cache[];  // [corner * CHUNKS + chunk][thread of the block]

__device__ __forceinline__ void copy16_async(void* smem, const void* gmem) {
    unsigned int s = (unsigned int)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
}

__device__ __forceinline__ void wait_async() { asm volatile("cp.async.wait_all;\n" ::); }

__device__ __forceinline__ float2 halves(unsigned int u) {
    float lo, hi;
    asm("{.reg .f16 a, b;\n mov.b32 {a, b}, %2;\n cvt.f32.f16 %0, a;\n cvt.f32.f16 %1, b;}\n"
        : "=f"(lo), "=f"(hi) : "r"(u));
    return make_float2(lo, hi);
}

struct Geo {
    const uint4* field;
    Grid g;
    R3 inv_vs;       // 1 / voxel size
    real inv_scale;  // undoes the power-of-two factor of the float16 derivatives
    uint4* cache;    // this thread's column of cell_cache
    int stride;      // threads per block
    int ci, cj, ck;  // the cached cell (its lowest corner)

    __device__ R3 to_voxel(R3 x_mm) const { return mul3r(x_mm, inv_vs); }

    // Trilinear interpolation at voxel position p (clamped to voxel centres) of C (and,
    // with FULL, of the derivatives): out[0..6) or out[0..24).
    template <bool FULL>
    __device__ void interpolate(R3 p, real out[24]) {
        real x = fminf(fmaxf(p.x, 0.0f), (real)(g.nx - 1));
        real y = fminf(fmaxf(p.y, 0.0f), (real)(g.ny - 1));
        real z = fminf(fmaxf(p.z, 0.0f), (real)(g.nz - 1));
        real bx = floorf(x), by = floorf(y), bz = floorf(z);
        real fx = x - bx, fy = y - by, fz = z - bz;
        int i0 = (int)bx, j0 = (int)by, k0 = (int)bz;
        if (i0 != ci || j0 != cj || k0 != ck) {
            ci = i0; cj = j0; ck = k0;
            int di = (i0 + 1 < g.nx) ? g.ny * g.nz : 0;
            int dj = (j0 + 1 < g.ny) ? g.nz : 0;
            int dk = (k0 + 1 < g.nz) ? 1 : 0;
            long long base = ((long long)i0 * g.ny + j0) * g.nz + k0;
#pragma unroll
            for (int corner = 0; corner < 8; ++corner) {
                const uint4* src = field + (base + (corner >> 2) * di + ((corner >> 1) & 1) * dj + (corner & 1) * dk) * CHUNKS;
#pragma unroll
                for (int k = 0; k < CHUNKS; ++k) copy16_async(cache + (corner * CHUNKS + k) * stride, src + k);
            }
            wait_async();
        }
        const int n_out = FULL ? 24 : 6;
        real wx[2] = {1.0f - fx, fx}, wy[2] = {1.0f - fy, fy}, wz[2] = {1.0f - fz, fz};
#pragma unroll
        for (int c = 0; c < n_out; ++c) out[c] = 0.0f;
#pragma unroll 4  // corners per trip: 8% faster than 2, 3% faster than 8 on the H100
        for (int corner = 0; corner < 8; ++corner) {
            real w = wx[corner >> 2] * wy[(corner >> 1) & 1] * wz[corner & 1];
            const uint4* src = cache + corner * CHUNKS * stride;
            uint4 q0 = src[0], q1 = src[stride];
            real s[24];
            s[0] = __uint_as_float(q0.x); s[1] = __uint_as_float(q0.y); s[2] = __uint_as_float(q0.z);
            s[3] = __uint_as_float(q0.w); s[4] = __uint_as_float(q1.x); s[5] = __uint_as_float(q1.y);
            if (FULL) {
                uint4 q2 = src[2 * stride], q3 = src[3 * stride];
                unsigned int u[9] = {q1.z, q1.w, q2.x, q2.y, q2.z, q2.w, q3.x, q3.y, q3.z};
#pragma unroll
                for (int k = 0; k < 9; ++k) {
                    float2 f = halves(u[k]);
                    s[6 + 2 * k] = f.x; s[7 + 2 * k] = f.y;
                }
            }
#pragma unroll
            for (int k = 0; k < n_out; ++k) out[k] = fmaf(w, s[k], out[k]);
        }
    }

    // Geodesic acceleration -C (w - q/2) at x (mm) for velocity v; C there in c.
    __device__ R3 accel(R3 x_mm, R3 v, real c[6]) {
        real s[24];
        interpolate<true>(to_voxel(x_mm), s);
#pragma unroll
        for (int i = 0; i < 6; ++i) c[i] = s[i];
        R3 m0 = apply_tensorr(s + 6, v), m1 = apply_tensorr(s + 12, v), m2 = apply_tensorr(s + 18, v);
        R3 w = add3r(add3r(scale3r(m0, v.x), scale3r(m1, v.y)), scale3r(m2, v.z));
        R3 q = r3(dot3r(m0, v), dot3r(m1, v), dot3r(m2, v));
        R3 r = add3r(w, scale3r(q, (real)-0.5));
        return scale3r(apply_tensorr(c, r), -inv_scale);
    }

    __device__ void tensor(R3 x_mm, real c[6]) {
        real s[24];
        interpolate<false>(to_voxel(x_mm), s);
#pragma unroll
        for (int i = 0; i < 6; ++i) c[i] = s[i];
    }
};

// G = C^-1 by cofactors (as gpu.geodesic._inverse).
__device__ __forceinline__ void inverse(const real s[6], real gm[6]) {
    real a = s[0], b = s[1], c = s[2], d = s[3], e = s[4], f = s[5];
    real i00 = d * f - e * e, i01 = c * e - b * f, i02 = b * e - c * d;
    real i11 = a * f - c * c, i12 = b * c - a * e, i22 = a * d - b * b;
    real det = a * i00 + b * i01 + c * i02;
    gm[0] = i00 / det; gm[1] = i01 / det; gm[2] = i02 / det;
    gm[3] = i11 / det; gm[4] = i12 / det; gm[5] = i22 / det;
}

struct Settings {
    const unsigned char* region;
    const float* starts;
    const float* dirs;
    R3 vs;
    real h, max_length, cos_max, fa_threshold, mask_tolerance;
    int integrator, max_steps, normalize, every, stop_at_target, slots;
};

// One fibre in flight.
struct Ray {
    R3 x, v, prev;
    real euclid, geolen, cm, cm_target;
    real outside, excursion;  // mm run since the last point inside the mask; longest such run that came back
    long long steps, stored, reached;
    unsigned char reason;
    bool last_stored;
    float* pts;
    float* cm_row;

    __device__ void store(R3 q, real cm_value) {
        pts[3 * stored] = q.x; pts[3 * stored + 1] = q.y; pts[3 * stored + 2] = q.z;
        cm_row[stored] = cm_value;
        ++stored;
    }

    // Set up fibre i; false when its start is outside the volume or the mask.
    __device__ bool start(int i, const Settings& s, Geo& geo, float* points, float* cms) {
        pts = points + (size_t)i * s.slots * 3;
        cm_row = cms + (size_t)i * s.slots;
        R3 p0 = r3(s.starts[3 * i], s.starts[3 * i + 1], s.starts[3 * i + 2]);
        x = mul3r(p0, s.vs);
        v = unit3r(r3(s.dirs[3 * i], s.dirs[3 * i + 1], s.dirs[3 * i + 2]), r3(1, 0, 0));
        prev = v;
        stored = 0;
        store(p0, 0.0f);
        steps = 0; reached = -1;
        cm_target = __int_as_float(0x7fc00000); cm = 0.0f;
        euclid = 0.0f; geolen = 0.0f;
        outside = 0.0f; excursion = 0.0f;
        reason = 0;
        last_stored = true;
        geo.ci = -1;  // another fibre: the cached cell is no longer known to be near
        if (!inside_volume(p0, geo.g)) { reason = OUTSIDE_VOLUME; return false; }
        if ((s.region[nearest_voxel(p0, geo.g)] & TRACK_BIT) == 0) { reason = OUTSIDE_MASK; return false; }
        return true;
    }

    // One integration step; false when the fibre has ended (reason set).
    __device__ bool step(const Settings& s, Geo& geo) {
        if (steps >= s.max_steps) { reason = MAX_STEPS; return false; }
        const real h = s.h;
        real c1[6], cmid[6];
        R3 a1 = geo.accel(x, v, c1);
        if (s.fa_threshold > 0.0f && fa_invariants(c1) < s.fa_threshold) { reason = LOW_FA; return false; }
        R3 x_new, v_new;
        if (s.integrator == 0) {
            x_new = add3r(x, scale3r(v, h));
            v_new = add3r(v, scale3r(a1, h));
        } else if (s.integrator == 1) {
            R3 xm = add3r(x, scale3r(v, 0.5f * h)), vm = add3r(v, scale3r(a1, 0.5f * h));
            R3 a2 = geo.accel(xm, vm, cmid);
            x_new = add3r(x, scale3r(vm, h));
            v_new = add3r(v, scale3r(a2, h));
        } else {
            real c_[6];
            R3 k1x = v, k1v = a1;
            R3 k2x = add3r(v, scale3r(k1v, 0.5f * h));
            R3 k2v = geo.accel(add3r(x, scale3r(k1x, 0.5f * h)), k2x, cmid);
            R3 k3x = add3r(v, scale3r(k2v, 0.5f * h));
            R3 k3v = geo.accel(add3r(x, scale3r(k2x, 0.5f * h)), k3x, c_);
            R3 k4x = add3r(v, scale3r(k3v, h));
            R3 k4v = geo.accel(add3r(x, scale3r(k3x, h)), k4x, c_);
            R3 sx = add3r(add3r(k1x, scale3r(k2x, 2.0f)), add3r(scale3r(k3x, 2.0f), k4x));
            R3 sv = add3r(add3r(k1v, scale3r(k2v, 2.0f)), add3r(scale3r(k3v, 2.0f), k4v));
            x_new = add3r(x, scale3r(sx, h / 6.0f));
            v_new = add3r(v, scale3r(sv, h / 6.0f));
        }
        if (s.normalize) v_new = unit3r(v_new, v);
        R3 q = geo.to_voxel(x_new);
        R3 dx = add3r(x_new, scale3r(x, -1.0f));
        real seg = sqrtf(dot3r(dx, dx));
        if (!inside_volume(q, geo.g)) { reason = OUTSIDE_VOLUME; return false; }
        unsigned char code = s.region[nearest_voxel(q, geo.g)];
        bool out_mask = (code & TRACK_BIT) == 0;
        real run_out = out_mask ? outside + seg : 0.0f;
        // a thousandth of a step of slack: a tolerance that is a whole number of steps is met alike by
        // float32 and float64 sums of the segments (gpu/geodesic.py TOLERANCE_SLACK)
        if (out_mask && (run_out > s.mask_tolerance + (TOLERANCE_SLACK_MICROSTEPS * 1e-6f) * s.h || s.mask_tolerance <= 0.0f)) {
            reason = OUTSIDE_MASK;
            return false;
        }
        real turn = dot3r(dx, prev) / (seg > 0.0f ? seg : 1.0f);
        if (turn < s.cos_max) { reason = SHARP_ANGLE; return false; }
        if (s.integrator == 0) geo.tensor(add3r(x, scale3r(v, 0.5f * h)), cmid);  // Euler has no midpoint stage
        if (run_out == 0.0f && outside > 0.0f) excursion = fmaxf(excursion, outside);  // came back inside
        outside = run_out;
        real gm[6];
        inverse(cmid, gm);
        euclid += seg;
        geolen += sqrtf(fmaxf(dot3r(dx, apply_tensorr(gm, dx)), 0.0f));
        cm = euclid / (geolen > 0.0f ? geolen : 1.0f);
        x = x_new;
        v = v_new;
        prev = scale3r(dx, 1.0f / (seg > 0.0f ? seg : 1.0f));
        ++steps;
        if (steps == 1) cm_row[0] = cm;
        last_stored = steps % s.every == 0;
        bool hit = (code & TARGET_BIT) && reached < 0;
        if (hit) { reached = steps; cm_target = cm; }
        bool end = false;
        if (s.max_length > 0.0f && euclid >= s.max_length) { reason = MAX_LENGTH; end = true; }
        else if (s.stop_at_target && hit) { reason = REACHED_TARGET; end = true; }
        if (last_stored || end) {
            store(q, cm);
            last_stored = true;
        }
        return !end;
    }

    // Write the fibre's results (valid: it started inside).
    __device__ void finish(int i, bool valid, Geo& geo, long long* stored_out, unsigned char* stop_out,
                           unsigned char* valid_out, long long* steps_out, long long* reached_out,
                           float* cm_target_out, float* cm_end_out, float* excursion_out) {
        if (valid && !last_stored) store(geo.to_voxel(x), cm);  // the last accepted point
        stored_out[i] = stored;
        stop_out[i] = reason;
        valid_out[i] = valid;
        steps_out[i] = steps;
        reached_out[i] = reached;
        cm_target_out[i] = cm_target;
        cm_end_out[i] = cm_row[stored - 1];
        excursion_out[i] = excursion;
    }
};

// Persistent threads: launch about as many as fit on the device; each takes fibres from
// *next until all n are done.
extern "C" __global__ void geodesic_trace(
    const uint4* __restrict__ field, const unsigned char* __restrict__ region, int nx, int ny, int nz,
    const float* __restrict__ starts, const float* __restrict__ dirs, int n, float vsx, float vsy, float vsz,
    float inv_scale, float h, int integrator, int max_steps, float max_length, float cos_max, float fa_threshold,
    float mask_tolerance, int normalize, int every, int stop_at_target, int slots, int* __restrict__ next, float* __restrict__ points,
    float* __restrict__ cms, long long* __restrict__ stored_out, unsigned char* __restrict__ stop_out,
    unsigned char* __restrict__ valid_out, long long* __restrict__ steps_out, long long* __restrict__ reached_out,
    float* __restrict__ cm_target_out, float* __restrict__ cm_end_out, float* __restrict__ excursion_out) {
    Geo geo;
    geo.field = field;
    geo.g.nx = nx; geo.g.ny = ny; geo.g.nz = nz;
    geo.inv_vs = r3(1.0f / vsx, 1.0f / vsy, 1.0f / vsz);
    geo.inv_scale = inv_scale;
    geo.cache = cell_cache + threadIdx.x;
    geo.stride = blockDim.x;
    geo.ci = -1;
    Settings s;
    s.region = region; s.starts = starts; s.dirs = dirs;
    s.vs = r3(vsx, vsy, vsz);
    s.h = h; s.max_length = max_length; s.cos_max = cos_max; s.fa_threshold = fa_threshold;
    s.mask_tolerance = mask_tolerance;
    s.integrator = integrator; s.max_steps = max_steps; s.normalize = normalize; s.every = every;
    s.stop_at_target = stop_at_target; s.slots = slots;
    Ray ray;
    int i = -1;
    bool live = false, valid = false;
    // One loop for both taking work and stepping, so that a thread that starts a new
    // fibre keeps stepping in lockstep with the rest of its warp.
    while (true) {
        if (!live) {
            if (i >= 0) ray.finish(i, valid, geo, stored_out, stop_out, valid_out, steps_out, reached_out,
                                   cm_target_out, cm_end_out, excursion_out);
            i = atomicAdd(next, 1);
            if (i >= n) break;
            valid = ray.start(i, s, geo, points, cms);
            live = valid;
            if (!live) continue;
        }
        live = ray.step(s, geo);
    }
}
