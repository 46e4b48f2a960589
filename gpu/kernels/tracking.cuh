// Device code shared by the tracking kernels, in the precision `real` that the kernel
// source defines before this header (double for deterministic tracking, where the
// kernel is a few per cent of the end-to-end time, so it can match the float64 NumPy
// reference to 1e-9 voxel). Positions are voxel coordinates
// (voxel i centred at i); a point is inside the volume when every coordinate is in
// [-0.5, n - 0.5). Tensor fields hold 8 floats per voxel (xx, xy, xz, yy, yz, zz, 0, 0)
// so a voxel is two aligned float4 loads. Everything mirrors gpu/interpolate.py and
// gpu/sym3.py (principal), which are the references.

struct R3 {
    real x, y, z;
};

__device__ __forceinline__ R3 r3(real x, real y, real z) { R3 r; r.x = x; r.y = y; r.z = z; return r; }
__device__ __forceinline__ real dot3r(R3 a, R3 b) { return a.x * b.x + a.y * b.y + a.z * b.z; }
__device__ __forceinline__ R3 cross3r(R3 a, R3 b) {
    return r3(a.y * b.z - a.z * b.y, a.z * b.x - a.x * b.z, a.x * b.y - a.y * b.x);
}
__device__ __forceinline__ R3 add3r(R3 a, R3 b) { return r3(a.x + b.x, a.y + b.y, a.z + b.z); }
__device__ __forceinline__ R3 scale3r(R3 a, real s) { return r3(a.x * s, a.y * s, a.z * s); }
__device__ __forceinline__ R3 mul3r(R3 a, R3 b) { return r3(a.x * b.x, a.y * b.y, a.z * b.z); }
__device__ __forceinline__ R3 unit3r(R3 u, R3 fallback) {
    real n = sqrt(dot3r(u, u));
    return n > 0.0 ? r3(u.x / n, u.y / n, u.z / n) : fallback;
}

struct Grid {
    int nx, ny, nz;
};

__device__ __forceinline__ bool inside_volume(R3 p, Grid g) {
    return p.x >= -0.5 && p.y >= -0.5 && p.z >= -0.5 && p.x < g.nx - 0.5 && p.y < g.ny - 0.5 &&
           p.z < g.nz - 0.5;
}

// Linear index of the voxel containing p (clamped to the grid).
__device__ __forceinline__ long long nearest_voxel(R3 p, Grid g) {
    int i = min(max((int)floor(p.x + 0.5), 0), g.nx - 1);
    int j = min(max((int)floor(p.y + 0.5), 0), g.ny - 1);
    int k = min(max((int)floor(p.z + 0.5), 0), g.nz - 1);
    return ((long long)i * g.ny + j) * g.nz + k;
}

// Trilinear interpolation of the six tensor components at p (clamped to voxel centres).
__device__ void trilinear_tensor(const float4* __restrict__ field, Grid g, R3 p, real t[6]) {
    real x = fmin(fmax(p.x, 0.0), (real)(g.nx - 1));
    real y = fmin(fmax(p.y, 0.0), (real)(g.ny - 1));
    real z = fmin(fmax(p.z, 0.0), (real)(g.nz - 1));
    real bx = floor(x), by = floor(y), bz = floor(z);
    real fx = x - bx, fy = y - by, fz = z - bz;
    int i0 = (int)bx, j0 = (int)by, k0 = (int)bz;
    int ci[2] = {i0, min(i0 + 1, g.nx - 1)};
    int cj[2] = {j0, min(j0 + 1, g.ny - 1)};
    int ck[2] = {k0, min(k0 + 1, g.nz - 1)};
    real wx[2] = {1.0 - fx, fx}, wy[2] = {1.0 - fy, fy}, wz[2] = {1.0 - fz, fz};
#pragma unroll
    for (int c = 0; c < 6; ++c) t[c] = 0.0;
#pragma unroll
    for (int a = 0; a < 2; ++a)
#pragma unroll
        for (int b = 0; b < 2; ++b)
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                long long v = (((long long)ci[a] * g.ny + cj[b]) * g.nz + ck[c]) * 2;
                float4 lo = __ldg(field + v), hi = __ldg(field + v + 1);
                real w = wx[a] * wy[b] * wz[c];
                t[0] += w * lo.x; t[1] += w * lo.y; t[2] += w * lo.z;
                t[3] += w * lo.w; t[4] += w * hi.x; t[5] += w * hi.y;
            }
}

__device__ __forceinline__ R3 apply_tensorr(const real c[6], R3 v) {
    return r3(c[0] * v.x + c[1] * v.y + c[2] * v.z,
              c[1] * v.x + c[3] * v.y + c[4] * v.z,
              c[2] * v.x + c[4] * v.y + c[5] * v.z);
}

// FA = sqrt(1 - I2 / I4) from the invariants (sym3.fractional_anisotropy_from_invariants).
__device__ __forceinline__ real fa_invariants(const real t[6]) {
    real a = t[0], b = t[1], c = t[2], d = t[3], e = t[4], f = t[5];
    real i1 = a + d + f;
    real i2 = a * d + a * f + d * f - b * b - c * c - e * e;
    real i4 = i1 * i1 - 2.0 * i2;
    return i4 > 0.0 ? sqrt(fmax(1.0 - i2 / i4, 0.0)) : 0.0;
}

__device__ R3 eigvec_by_cross(const real c[6], real lam, R3 fallback) {
    R3 r0 = r3(c[0] - lam, c[1], c[2]);
    R3 r1 = r3(c[1], c[3] - lam, c[4]);
    R3 r2 = r3(c[2], c[4], c[5] - lam);
    R3 best = cross3r(r0, r1);
    real best_norm = dot3r(best, best);
    R3 cand = cross3r(r0, r2);
    real n = dot3r(cand, cand);
    if (n > best_norm) { best = cand; best_norm = n; }
    cand = cross3r(r1, r2);
    n = dot3r(cand, cand);
    if (n > best_norm) { best = cand; }
    return unit3r(best, fallback);
}

__device__ R3 eigvec_in_plane(const real c[6], R3 w, real lam) {
    R3 u;
    if (fabs(w.x) > fabs(w.y)) {
        real inv = 1.0 / sqrt(w.x * w.x + w.z * w.z);
        u = r3(-w.z * inv, 0.0, w.x * inv);
    } else {
        real inv = 1.0 / sqrt(w.y * w.y + w.z * w.z);
        u = r3(0.0, w.z * inv, -w.y * inv);
    }
    R3 v = cross3r(w, u);
    R3 au = apply_tensorr(c, u), av = apply_tensorr(c, v);
    real m00 = dot3r(u, au) - lam, m01 = dot3r(u, av), m11 = dot3r(v, av) - lam;
    real a00 = fabs(m00), a01 = fabs(m01), a11 = fabs(m11);
    bool row0 = a00 >= a11;
    real cu = row0 ? m01 : m11;
    real cv = row0 ? -m00 : -m01;
    real big = fmax(fmax(a00, a01), a11);
    R3 vec = unit3r(add3r(scale3r(u, cu), scale3r(v, cv)), u);
    return big > 0.0 ? vec : u;
}

// Eigenvalues (descending) and the main eigenvector (sym3.principal).
__device__ void principal3(const real t[6], real lam[3], R3* e1) {
    real scale = 0.0;
#pragma unroll
    for (int i = 0; i < 6; ++i) scale = fmax(scale, fabs(t[i]));
    bool nonzero = scale > 0.0;
    real s = nonzero ? scale : 1.0;
    real c[6];
#pragma unroll
    for (int i = 0; i < 6; ++i) c[i] = t[i] / s;
    real q = (c[0] + c[3] + c[5]) / 3.0;
    real b00 = c[0] - q, b11 = c[3] - q, b22 = c[5] - q;
    real p2 = b00 * b00 + b11 * b11 + b22 * b22 + 2.0 * (c[1] * c[1] + c[2] * c[2] + c[4] * c[4]);
    real p = sqrt(p2 / 6.0);
    bool aniso = p > 0.0;
    real ps = aniso ? p : 1.0;
    real c00 = b00 / ps, c11 = b11 / ps, c22 = b22 / ps;
    real c01 = c[1] / ps, c02 = c[2] / ps, c12 = c[4] / ps;
    real half_det = 0.5 * (c00 * (c11 * c22 - c12 * c12) - c01 * (c01 * c22 - c02 * c12) +
                             c02 * (c01 * c12 - c02 * c11));
    half_det = fmin(fmax(half_det, -1.0), 1.0);
    real angle = acos(half_det) / 3.0;
    real beta_hi = 2.0 * cos(angle);
    real beta_lo = 2.0 * cos(angle + 2.0943951023931953);
    real beta_mid = fmin(fmax(-(beta_hi + beta_lo), beta_lo), beta_hi);
    real lam_hi = q + p * beta_hi, lam_mid = q + p * beta_mid, lam_lo = q + p * beta_lo;
    R3 ex = r3(1.0, 0.0, 0.0);
    bool hi_first = half_det >= 0.0;
    R3 v_first = eigvec_by_cross(c, hi_first ? lam_hi : lam_lo, ex);
    R3 e = hi_first ? v_first : eigvec_in_plane(c, v_first, lam_hi);
    if (!(aniso && nonzero)) {
        e = ex;
        lam_hi = lam_mid = lam_lo = q;
    }
    lam[0] = nonzero ? lam_hi * s : 0.0;
    lam[1] = nonzero ? lam_mid * s : 0.0;
    lam[2] = nonzero ? lam_lo * s : 0.0;
    *e1 = e;
}
