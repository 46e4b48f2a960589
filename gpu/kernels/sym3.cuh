// Symmetric 3x3 tensors (xx, xy, xz, yy, yz, zz) in the precision `real` that the
// kernel source defines before this header: vector helpers and Eberly's closed-form
// eigensolver, exactly as gpu/sym3.py (eigh, principal), which is the reference.
// Used by the DTI fit (double) and the trackers.

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
    return n > (real)0.0 ? r3(u.x / n, u.y / n, u.z / n) : fallback;
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
    real i4 = i1 * i1 - (real)2.0 * i2;
    return i4 > (real)0.0 ? sqrt(fmax((real)1.0 - i2 / i4, (real)0.0)) : (real)0.0;
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

struct Eigenvalues {
    real c[6];  // the tensor scaled to unit max-abs entry
    real lam[3];  // scaled eigenvalues, descending
    real q, s;  // mean of the scaled diagonal; the scale
    bool hi_first, nonzero, aniso;
};

__device__ Eigenvalues eigenvalues3(const real t[6]) {
    Eigenvalues e;
    real scale = 0.0;
#pragma unroll
    for (int i = 0; i < 6; ++i) scale = fmax(scale, fabs(t[i]));
    e.nonzero = scale > 0.0;
    e.s = e.nonzero ? scale : (real)1.0;
#pragma unroll
    for (int i = 0; i < 6; ++i) e.c[i] = t[i] / e.s;
    const real* c = e.c;
    real q = (c[0] + c[3] + c[5]) / (real)3.0;
    real b00 = c[0] - q, b11 = c[3] - q, b22 = c[5] - q;
    real p2 = b00 * b00 + b11 * b11 + b22 * b22 + (real)2.0 * (c[1] * c[1] + c[2] * c[2] + c[4] * c[4]);
    real p = sqrt(p2 / (real)6.0);
    e.aniso = p > 0.0;
    real ps = e.aniso ? p : (real)1.0;
    real c00 = b00 / ps, c11 = b11 / ps, c22 = b22 / ps;
    real c01 = c[1] / ps, c02 = c[2] / ps, c12 = c[4] / ps;
    real half_det = (real)0.5 * (c00 * (c11 * c22 - c12 * c12) - c01 * (c01 * c22 - c02 * c12) +
                                 c02 * (c01 * c12 - c02 * c11));
    half_det = fmin(fmax(half_det, (real)-1.0), (real)1.0);
    real angle = acos(half_det) / (real)3.0;
    real beta_hi = (real)2.0 * cos(angle);
    real beta_lo = (real)2.0 * cos(angle + (real)(2.0 * 3.14159265358979323846 / 3.0));
    real beta_mid = fmin(fmax(-(beta_hi + beta_lo), beta_lo), beta_hi);
    e.lam[0] = q + p * beta_hi;
    e.lam[1] = q + p * beta_mid;
    e.lam[2] = q + p * beta_lo;
    e.q = q;
    e.hi_first = half_det >= 0.0;
    return e;
}

// Eigenvalues with their scale and zero restored; isotropic tensors get q for all three.
__device__ __forceinline__ void unscale3(const Eigenvalues& e, real lam[3]) {
    bool iso = !(e.aniso && e.nonzero);
#pragma unroll
    for (int i = 0; i < 3; ++i) lam[i] = e.nonzero ? (iso ? e.q : e.lam[i]) * e.s : (real)0.0;
}

// Eigenvalues (descending) and eigenvectors (sym3.eigh).
__device__ void eigh3(const real t[6], real lam[3], R3 vec[3]) {
    Eigenvalues e = eigenvalues3(t);
    R3 ex = r3(1, 0, 0), ey = r3(0, 1, 0), ez = r3(0, 0, 1);
    R3 v_first = eigvec_by_cross(e.c, e.hi_first ? e.lam[0] : e.lam[2], ex);
    R3 v_mid = eigvec_in_plane(e.c, v_first, e.lam[1]);
    R3 v_last = cross3r(v_first, v_mid);
    vec[0] = e.hi_first ? v_first : v_last;
    vec[1] = v_mid;
    vec[2] = e.hi_first ? v_last : v_first;
    if (!(e.aniso && e.nonzero)) {
        vec[0] = ex; vec[1] = ey; vec[2] = ez;
    }
    unscale3(e, lam);
}

// Eigenvalues (descending) and the main eigenvector only (sym3.principal).
__device__ void principal3(const real t[6], real lam[3], R3* e1) {
    Eigenvalues e = eigenvalues3(t);
    R3 ex = r3(1, 0, 0);
    R3 v_first = eigvec_by_cross(e.c, e.hi_first ? e.lam[0] : e.lam[2], ex);
    R3 v = e.hi_first ? v_first : eigvec_in_plane(e.c, v_first, e.lam[0]);
    *e1 = (e.aniso && e.nonzero) ? v : ex;
    unscale3(e, lam);
}
