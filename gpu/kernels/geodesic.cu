typedef float real;  // the precision of sym3.cuh and tracking.cuh here (see gpu/cuda.py)

// Geodesic ray tracing, one thread per fibre; gpu/geodesic.py has the rules and the
// array-operations reference this kernel reproduces (in float32). The field holds 24
// floats per voxel (6 float4): C, dG/dx, dG/dy, dG/dz, derivatives in mm. Positions
// are integrated in mm along the voxel axes; lookups use voxel coordinates.

#define OUTSIDE_VOLUME 2
#define OUTSIDE_MASK 3
#define LOW_FA 4
#define SHARP_ANGLE 5
#define MAX_LENGTH 1
#define MAX_STEPS 7
#define REACHED_TARGET 8
#define TRACK_BIT 1
#define TARGET_BIT 2

struct Geo {
    const float4* field;
    Grid g;
    R3 inv_vs;  // 1 / voxel size

    __device__ R3 to_voxel(R3 x_mm) const { return mul3r(x_mm, inv_vs); }

    // Geodesic acceleration -C (w - q/2) at x (mm) for velocity v; C there in c.
    __device__ R3 accel(R3 x_mm, R3 v, real c[6]) const {
        real s[24];
        trilinear_f4<6, 6>(field, g, to_voxel(x_mm), s);
#pragma unroll
        for (int i = 0; i < 6; ++i) c[i] = s[i];
        R3 m0 = apply_tensorr(s + 6, v), m1 = apply_tensorr(s + 12, v), m2 = apply_tensorr(s + 18, v);
        R3 w = add3r(add3r(scale3r(m0, v.x), scale3r(m1, v.y)), scale3r(m2, v.z));
        R3 q = r3(dot3r(m0, v), dot3r(m1, v), dot3r(m2, v));
        R3 r = add3r(w, scale3r(q, (real)-0.5));
        return scale3r(apply_tensorr(c, r), (real)-1.0);
    }

    // G = C^-1 at x (mm), by cofactors.
    __device__ void metric(R3 x_mm, real gm[6]) const {
        real s[8];
        trilinear_f4<6, 2>(field, g, to_voxel(x_mm), s);
        real a = s[0], b = s[1], c = s[2], d = s[3], e = s[4], f = s[5];
        real i00 = d * f - e * e, i01 = c * e - b * f, i02 = b * e - c * d;
        real i11 = a * f - c * c, i12 = b * c - a * e, i22 = a * d - b * b;
        real det = a * i00 + b * i01 + c * i02;
        gm[0] = i00 / det; gm[1] = i01 / det; gm[2] = i02 / det;
        gm[3] = i11 / det; gm[4] = i12 / det; gm[5] = i22 / det;
    }
};

extern "C" __global__ void geodesic_trace(
    const float4* __restrict__ field, const unsigned char* __restrict__ region, int nx, int ny, int nz,
    const float* __restrict__ starts, const float* __restrict__ dirs, int n, float vsx, float vsy, float vsz,
    float h, int integrator, int max_steps, float max_length, float cos_max, float fa_threshold, int normalize,
    int every, int stop_at_target, int slots, float* __restrict__ points, float* __restrict__ cms,
    long long* __restrict__ stored_out, unsigned char* __restrict__ stop_out, unsigned char* __restrict__ valid_out,
    long long* __restrict__ steps_out, long long* __restrict__ reached_out, float* __restrict__ cm_target_out,
    float* __restrict__ cm_end_out) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    Geo geo;
    geo.field = field;
    geo.g.nx = nx; geo.g.ny = ny; geo.g.nz = nz;
    geo.inv_vs = r3(1.0f / vsx, 1.0f / vsy, 1.0f / vsz);
    const R3 vs = r3(vsx, vsy, vsz);
    float* pts = points + (size_t)i * slots * 3;
    float* cm_row = cms + (size_t)i * slots;
    R3 p0 = r3(starts[3 * i], starts[3 * i + 1], starts[3 * i + 2]);
    R3 x = mul3r(p0, vs);
    R3 v = unit3r(r3(dirs[3 * i], dirs[3 * i + 1], dirs[3 * i + 2]), r3(1, 0, 0));
    pts[0] = p0.x; pts[1] = p0.y; pts[2] = p0.z;
    cm_row[0] = 0.0f;
    long long stored = 1, steps = 0, reached = -1;
    float cm_target = __int_as_float(0x7fc00000), cm = 0.0f;
    unsigned char reason = 0;
    bool ok = inside_volume(p0, geo.g);
    if (!ok) reason = OUTSIDE_VOLUME;
    else if ((region[nearest_voxel(p0, geo.g)] & TRACK_BIT) == 0) { reason = OUTSIDE_MASK; ok = false; }
    valid_out[i] = ok;
    real euclid = 0.0f, geolen = 0.0f;
    R3 prev = v;
    bool last_stored = true;
    while (ok) {
        if (steps >= max_steps) { reason = MAX_STEPS; break; }
        real c1[6];
        R3 a1 = geo.accel(x, v, c1);
        if (fa_threshold > 0.0f && fa_invariants(c1) < fa_threshold) { reason = LOW_FA; break; }
        R3 x_new, v_new;
        if (integrator == 0) {
            x_new = add3r(x, scale3r(v, h));
            v_new = add3r(v, scale3r(a1, h));
        } else if (integrator == 1) {
            real cm_[6];
            R3 xm = add3r(x, scale3r(v, 0.5f * h)), vm = add3r(v, scale3r(a1, 0.5f * h));
            R3 a2 = geo.accel(xm, vm, cm_);
            x_new = add3r(x, scale3r(vm, h));
            v_new = add3r(v, scale3r(a2, h));
        } else {
            real cm_[6];
            R3 k1x = v, k1v = a1;
            R3 k2x = add3r(v, scale3r(k1v, 0.5f * h));
            R3 k2v = geo.accel(add3r(x, scale3r(k1x, 0.5f * h)), k2x, cm_);
            R3 k3x = add3r(v, scale3r(k2v, 0.5f * h));
            R3 k3v = geo.accel(add3r(x, scale3r(k2x, 0.5f * h)), k3x, cm_);
            R3 k4x = add3r(v, scale3r(k3v, h));
            R3 k4v = geo.accel(add3r(x, scale3r(k3x, h)), k4x, cm_);
            R3 sx = add3r(add3r(k1x, scale3r(k2x, 2.0f)), add3r(scale3r(k3x, 2.0f), k4x));
            R3 sv = add3r(add3r(k1v, scale3r(k2v, 2.0f)), add3r(scale3r(k3v, 2.0f), k4v));
            x_new = add3r(x, scale3r(sx, h / 6.0f));
            v_new = add3r(v, scale3r(sv, h / 6.0f));
        }
        if (normalize) v_new = unit3r(v_new, v);
        R3 q = geo.to_voxel(x_new);
        if (!inside_volume(q, geo.g)) { reason = OUTSIDE_VOLUME; break; }
        unsigned char code = region[nearest_voxel(q, geo.g)];
        if ((code & TRACK_BIT) == 0) { reason = OUTSIDE_MASK; break; }
        R3 dx = add3r(x_new, scale3r(x, -1.0f));
        real seg = sqrt(dot3r(dx, dx));
        real turn = dot3r(dx, prev) / (seg > 0.0f ? seg : 1.0f);
        if (turn < cos_max) { reason = SHARP_ANGLE; break; }
        real gm[6];
        geo.metric(add3r(x, scale3r(dx, 0.5f)), gm);
        euclid += seg;
        geolen += sqrt(fmax(dot3r(dx, apply_tensorr(gm, dx)), (real)0.0));
        cm = euclid / (geolen > 0.0f ? geolen : 1.0f);
        x = x_new;
        v = v_new;
        prev = scale3r(dx, 1.0f / (seg > 0.0f ? seg : 1.0f));
        ++steps;
        if (steps == 1) cm_row[0] = cm;
        last_stored = steps % every == 0;
        bool hit = (code & TARGET_BIT) && reached < 0;
        if (hit) { reached = steps; cm_target = cm; }
        bool end = false;
        if (max_length > 0.0f && euclid >= max_length) { reason = MAX_LENGTH; end = true; }
        else if (stop_at_target && hit) { reason = REACHED_TARGET; end = true; }
        if (last_stored || end) {
            pts[3 * stored] = q.x; pts[3 * stored + 1] = q.y; pts[3 * stored + 2] = q.z;
            cm_row[stored] = cm;
            ++stored;
            last_stored = true;
        }
        if (end) break;
    }
    if (ok && !last_stored) {  // the last accepted point, when the step that ended it was not stored
        R3 q = geo.to_voxel(x);
        pts[3 * stored] = q.x; pts[3 * stored + 1] = q.y; pts[3 * stored + 2] = q.z;
        cm_row[stored] = cm;
        ++stored;
    }
    stored_out[i] = stored;
    stop_out[i] = reason;
    steps_out[i] = steps;
    reached_out[i] = reached;
    cm_target_out[i] = cm_target;
    cm_end_out[i] = cm_row[stored - 1];
}
