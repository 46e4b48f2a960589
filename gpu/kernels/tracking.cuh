// Device code shared by the tracking kernels. Positions are voxel coordinates
// (voxel i centred at i); a point is inside the volume when every coordinate is in
// [-0.5, n - 0.5). Tensor fields hold 8 floats per voxel (xx, xy, xz, yy, yz, zz, 0, 0)
// so a voxel is two aligned float4 loads. Everything mirrors gpu/interpolate.py and
// gpu/sym3.py (principal), which are the references.

struct F3 {
    float x, y, z;
};

__device__ __forceinline__ F3 f3(float x, float y, float z) { F3 r; r.x = x; r.y = y; r.z = z; return r; }
__device__ __forceinline__ float dot3f(F3 a, F3 b) { return a.x * b.x + a.y * b.y + a.z * b.z; }
__device__ __forceinline__ F3 cross3f(F3 a, F3 b) {
    return f3(a.y * b.z - a.z * b.y, a.z * b.x - a.x * b.z, a.x * b.y - a.y * b.x);
}
__device__ __forceinline__ F3 add3f(F3 a, F3 b) { return f3(a.x + b.x, a.y + b.y, a.z + b.z); }
__device__ __forceinline__ F3 scale3f(F3 a, float s) { return f3(a.x * s, a.y * s, a.z * s); }
__device__ __forceinline__ F3 mul3f(F3 a, F3 b) { return f3(a.x * b.x, a.y * b.y, a.z * b.z); }
__device__ __forceinline__ F3 unit3f(F3 u, F3 fallback) {
    float n = sqrtf(dot3f(u, u));
    return n > 0.0f ? f3(u.x / n, u.y / n, u.z / n) : fallback;
}

struct Grid {
    int nx, ny, nz;
};

__device__ __forceinline__ bool inside_volume(F3 p, Grid g) {
    return p.x >= -0.5f && p.y >= -0.5f && p.z >= -0.5f && p.x < g.nx - 0.5f && p.y < g.ny - 0.5f &&
           p.z < g.nz - 0.5f;
}

// Linear index of the voxel containing p (clamped to the grid).
__device__ __forceinline__ long long nearest_voxel(F3 p, Grid g) {
    int i = min(max((int)floorf(p.x + 0.5f), 0), g.nx - 1);
    int j = min(max((int)floorf(p.y + 0.5f), 0), g.ny - 1);
    int k = min(max((int)floorf(p.z + 0.5f), 0), g.nz - 1);
    return ((long long)i * g.ny + j) * g.nz + k;
}

// Trilinear interpolation of the six tensor components at p (clamped to voxel centres).
__device__ void trilinear_tensor(const float4* __restrict__ field, Grid g, F3 p, float t[6]) {
    float x = fminf(fmaxf(p.x, 0.0f), (float)(g.nx - 1));
    float y = fminf(fmaxf(p.y, 0.0f), (float)(g.ny - 1));
    float z = fminf(fmaxf(p.z, 0.0f), (float)(g.nz - 1));
    float bx = floorf(x), by = floorf(y), bz = floorf(z);
    float fx = x - bx, fy = y - by, fz = z - bz;
    int i0 = (int)bx, j0 = (int)by, k0 = (int)bz;
    int ci[2] = {i0, min(i0 + 1, g.nx - 1)};
    int cj[2] = {j0, min(j0 + 1, g.ny - 1)};
    int ck[2] = {k0, min(k0 + 1, g.nz - 1)};
    float wx[2] = {1.0f - fx, fx}, wy[2] = {1.0f - fy, fy}, wz[2] = {1.0f - fz, fz};
#pragma unroll
    for (int c = 0; c < 6; ++c) t[c] = 0.0f;
#pragma unroll
    for (int a = 0; a < 2; ++a)
#pragma unroll
        for (int b = 0; b < 2; ++b)
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                long long v = (((long long)ci[a] * g.ny + cj[b]) * g.nz + ck[c]) * 2;
                float4 lo = __ldg(field + v), hi = __ldg(field + v + 1);
                float w = wx[a] * wy[b] * wz[c];
                t[0] += w * lo.x; t[1] += w * lo.y; t[2] += w * lo.z;
                t[3] += w * lo.w; t[4] += w * hi.x; t[5] += w * hi.y;
            }
}

__device__ __forceinline__ F3 apply_tensorf(const float c[6], F3 v) {
    return f3(c[0] * v.x + c[1] * v.y + c[2] * v.z,
              c[1] * v.x + c[3] * v.y + c[4] * v.z,
              c[2] * v.x + c[4] * v.y + c[5] * v.z);
}

// FA = sqrt(1 - I2 / I4) from the invariants (sym3.fractional_anisotropy_from_invariants).
__device__ __forceinline__ float fa_invariants(const float t[6]) {
    float a = t[0], b = t[1], c = t[2], d = t[3], e = t[4], f = t[5];
    float i1 = a + d + f;
    float i2 = a * d + a * f + d * f - b * b - c * c - e * e;
    float i4 = i1 * i1 - 2.0f * i2;
    return i4 > 0.0f ? sqrtf(fmaxf(1.0f - i2 / i4, 0.0f)) : 0.0f;
}

__device__ F3 eigvec_by_cross(const float c[6], float lam, F3 fallback) {
    F3 r0 = f3(c[0] - lam, c[1], c[2]);
    F3 r1 = f3(c[1], c[3] - lam, c[4]);
    F3 r2 = f3(c[2], c[4], c[5] - lam);
    F3 best = cross3f(r0, r1);
    float best_norm = dot3f(best, best);
    F3 cand = cross3f(r0, r2);
    float n = dot3f(cand, cand);
    if (n > best_norm) { best = cand; best_norm = n; }
    cand = cross3f(r1, r2);
    n = dot3f(cand, cand);
    if (n > best_norm) { best = cand; }
    return unit3f(best, fallback);
}

__device__ F3 eigvec_in_plane(const float c[6], F3 w, float lam) {
    F3 u;
    if (fabsf(w.x) > fabsf(w.y)) {
        float inv = 1.0f / sqrtf(w.x * w.x + w.z * w.z);
        u = f3(-w.z * inv, 0.0f, w.x * inv);
    } else {
        float inv = 1.0f / sqrtf(w.y * w.y + w.z * w.z);
        u = f3(0.0f, w.z * inv, -w.y * inv);
    }
    F3 v = cross3f(w, u);
    F3 au = apply_tensorf(c, u), av = apply_tensorf(c, v);
    float m00 = dot3f(u, au) - lam, m01 = dot3f(u, av), m11 = dot3f(v, av) - lam;
    float a00 = fabsf(m00), a01 = fabsf(m01), a11 = fabsf(m11);
    bool row0 = a00 >= a11;
    float cu = row0 ? m01 : m11;
    float cv = row0 ? -m00 : -m01;
    float big = fmaxf(fmaxf(a00, a01), a11);
    F3 vec = unit3f(add3f(scale3f(u, cu), scale3f(v, cv)), u);
    return big > 0.0f ? vec : u;
}

// Eigenvalues (descending) and the main eigenvector (sym3.principal).
__device__ void principal3(const float t[6], float lam[3], F3* e1) {
    float scale = 0.0f;
#pragma unroll
    for (int i = 0; i < 6; ++i) scale = fmaxf(scale, fabsf(t[i]));
    bool nonzero = scale > 0.0f;
    float s = nonzero ? scale : 1.0f;
    float c[6];
#pragma unroll
    for (int i = 0; i < 6; ++i) c[i] = t[i] / s;
    float q = (c[0] + c[3] + c[5]) / 3.0f;
    float b00 = c[0] - q, b11 = c[3] - q, b22 = c[5] - q;
    float p2 = b00 * b00 + b11 * b11 + b22 * b22 + 2.0f * (c[1] * c[1] + c[2] * c[2] + c[4] * c[4]);
    float p = sqrtf(p2 / 6.0f);
    bool aniso = p > 0.0f;
    float ps = aniso ? p : 1.0f;
    float c00 = b00 / ps, c11 = b11 / ps, c22 = b22 / ps;
    float c01 = c[1] / ps, c02 = c[2] / ps, c12 = c[4] / ps;
    float half_det = 0.5f * (c00 * (c11 * c22 - c12 * c12) - c01 * (c01 * c22 - c02 * c12) +
                             c02 * (c01 * c12 - c02 * c11));
    half_det = fminf(fmaxf(half_det, -1.0f), 1.0f);
    float angle = acosf(half_det) / 3.0f;
    float beta_hi = 2.0f * cosf(angle);
    float beta_lo = 2.0f * cosf(angle + 2.0943951023931953f);
    float beta_mid = fminf(fmaxf(-(beta_hi + beta_lo), beta_lo), beta_hi);
    float lam_hi = q + p * beta_hi, lam_mid = q + p * beta_mid, lam_lo = q + p * beta_lo;
    F3 ex = f3(1.0f, 0.0f, 0.0f);
    bool hi_first = half_det >= 0.0f;
    F3 v_first = eigvec_by_cross(c, hi_first ? lam_hi : lam_lo, ex);
    F3 e = hi_first ? v_first : eigvec_in_plane(c, v_first, lam_hi);
    if (!(aniso && nonzero)) {
        e = ex;
        lam_hi = lam_mid = lam_lo = q;
    }
    lam[0] = nonzero ? lam_hi * s : 0.0f;
    lam[1] = nonzero ? lam_mid * s : 0.0f;
    lam[2] = nonzero ? lam_lo * s : 0.0f;
    *e1 = e;
}
