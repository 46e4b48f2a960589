typedef double real;  // the precision of sym3.cuh and tracking.cuh here (see gpu/cuda.py)

// Deterministic tensor tracking, one thread per seed (gpu/deterministic.py has the
// rules and the array-operations reference this kernel reproduces). Each thread
// tracks forward, then backward with the rest of the length budget, writing points
// into its row of `buf` (seed at index m, forward at m + k, backward at m - k).

// Stop codes (gpu/streamlines.py) and region codes, passed by gpu/deterministic.py.
#ifndef MAX_LENGTH
#error "MAX_LENGTH is a compile-time constant defined by gpu/deterministic.py"
#endif
#ifndef OUTSIDE_VOLUME
#error "OUTSIDE_VOLUME is a compile-time constant defined by gpu/deterministic.py"
#endif
#ifndef OUTSIDE_MASK
#error "OUTSIDE_MASK is a compile-time constant defined by gpu/deterministic.py"
#endif
#ifndef LOW_FA
#error "LOW_FA is a compile-time constant defined by gpu/deterministic.py"
#endif
#ifndef SHARP_ANGLE
#error "SHARP_ANGLE is a compile-time constant defined by gpu/deterministic.py"
#endif
#ifndef STOP_REGION
#error "STOP_REGION is a compile-time constant defined by gpu/deterministic.py"
#endif
#ifndef REGION_OUTSIDE
#error "REGION_OUTSIDE is a compile-time constant defined by gpu/deterministic.py"
#endif
#ifndef REGION_STOP
#error "REGION_STOP is a compile-time constant defined by gpu/deterministic.py"
#endif

struct Tracker {
    const float4* field;
    Grid g;
    int tensorline;
    real puncture;

    // Unit direction at p continuing vref, and the FA there.
    __device__ R3 direction(R3 p, R3 vref, bool deflect, real* fa) const {
        real t[6], lam[3];
        R3 e1;
        trilinear_tensor(field, g, p, t);
        principal3(t, lam, &e1);
        *fa = fa_invariants(t);
        if (dot3r(e1, vref) < 0.0) e1 = scale3r(e1, -1.0);
        if (deflect) {
            real l1 = lam[0], l2 = lam[1];
            real cl = l1 > 0.0 ? (l1 - l2) / l1 : 0.0;
            cl = fmin(fmax(cl, 0.0), 1.0);
            R3 dv = unit3r(apply_tensorr(t, vref), vref);
            R3 mix = add3r(scale3r(vref, 1.0 - puncture), scale3r(dv, puncture));
            e1 = unit3r(add3r(scale3r(e1, cl), scale3r(mix, 1.0 - cl)), vref);
        }
        return e1;
    }
};

// The tensor tracker's part of the walk (walk.cuh): RK4 or Euler steps along the main
// eigenvector, stopping on low FA or a sharp turn.
struct TensorStep {
    const Tracker& tr;
    R3 h, half_h;
    bool rk4, tensorline;
    real fa_threshold, cos_max;

    __device__ R3 advance(R3 p, R3 d) const {
        if (!rk4) return d;
        real unused;
        R3 k2 = tr.direction(add3r(p, mul3r(half_h, d)), d, tensorline, &unused);
        R3 k3 = tr.direction(add3r(p, mul3r(half_h, k2)), d, tensorline, &unused);
        R3 k4 = tr.direction(add3r(p, mul3r(h, k3)), d, tensorline, &unused);
        return unit3r(add3r(add3r(d, scale3r(k2, 2.0)), add3r(scale3r(k3, 2.0), k4)), d);
    }

    __device__ unsigned char turn(R3 q, R3 v, int, int, R3* e) const {
        real fa;
        *e = tr.direction(q, v, tensorline, &fa);
        if (fa < fa_threshold) return LOW_FA;
        if (dot3r(*e, v) < cos_max) return SHARP_ANGLE;
        return 0;
    }
};

extern "C" __global__ void track_deterministic(
    const float4* __restrict__ field, const unsigned char* __restrict__ region, int nx, int ny, int nz,
    const real* __restrict__ seeds, int n, real hx, real hy, real hz, real fa_threshold, real cos_max,
    int m, int rk4, int tensorline, real puncture, float* __restrict__ buf, int* __restrict__ count,
    unsigned char* __restrict__ stop, unsigned char* __restrict__ valid) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    Tracker tr;
    tr.field = field;
    tr.g.nx = nx; tr.g.ny = ny; tr.g.nz = nz;
    tr.tensorline = tensorline;
    tr.puncture = puncture;
    const R3 h = r3(hx, hy, hz);
    const R3 half_h = r3(0.5 * hx, 0.5 * hy, 0.5 * hz);
    float* row = buf + (size_t)i * (size_t)(2 * m + 1) * 3;
    R3 p0 = r3(seeds[3 * i], seeds[3 * i + 1], seeds[3 * i + 2]);
    unsigned char seed_stop = start_row(row, m, p0, region, tr.g, count + 2 * i);
    valid[i] = seed_stop == 0;
    real fa;
    R3 d0 = tr.direction(p0, r3(0.8017837257372732, 0.5345224838248488, 0.2672612419124244), false, &fa);
    if (seed_stop == 0 && fa < fa_threshold) seed_stop = LOW_FA;
    if (seed_stop) {
        stop[2 * i] = seed_stop;
        stop[2 * i + 1] = seed_stop;
        return;
    }
    const TensorStep method = {tr, h, half_h, rk4 != 0, tensorline != 0, fa_threshold, cos_max};
    walk_halves(method, p0, d0, h, m, row, region, tr.g, count + 2 * i, stop + 2 * i);
}
