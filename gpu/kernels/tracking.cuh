// Device code shared by the tracking kernels, in the precision `real` that the kernel
// source defines (double for deterministic tracking, where the kernel is a few per
// cent of the end-to-end time, so it matches the float64 NumPy reference); needs
// sym3.cuh before it. Positions are voxel coordinates
// (voxel i centred at i); a point is inside the volume when every coordinate is in
// [-0.5, n - 0.5). Tensor fields hold 8 floats per voxel (xx, xy, xz, yy, yz, zz, 0, 0)
// so a voxel is two aligned float4 loads. Everything mirrors gpu/interpolate.py and
// gpu/sym3.py (principal), which are the references.

struct Grid {
    int nx, ny, nz;
};

__device__ __forceinline__ bool inside_volume(R3 p, Grid g) {
    const real h = (real)0.5;
    return p.x >= -h && p.y >= -h && p.z >= -h && p.x < g.nx - h && p.y < g.ny - h && p.z < g.nz - h;
}

// Linear index of the voxel containing p (clamped to the grid).
__device__ __forceinline__ long long nearest_voxel(R3 p, Grid g) {
    const real h = (real)0.5;
    int i = min(max((int)floor(p.x + h), 0), g.nx - 1);
    int j = min(max((int)floor(p.y + h), 0), g.ny - 1);
    int k = min(max((int)floor(p.z + h), 0), g.nz - 1);
    return ((long long)i * g.ny + j) * g.nz + k;
}

// Trilinear interpolation at p (clamped to voxel centres) of the first COUNT float4 of
// voxels that hold STRIDE float4 each: out[0 .. 4*COUNT).
template <int STRIDE, int COUNT>
__device__ void trilinear_f4(const float4* __restrict__ field, Grid g, R3 p, real out[4 * COUNT]) {
    real x = fmin(fmax(p.x, (real)0.0), (real)(g.nx - 1));
    real y = fmin(fmax(p.y, (real)0.0), (real)(g.ny - 1));
    real z = fmin(fmax(p.z, (real)0.0), (real)(g.nz - 1));
    real bx = floor(x), by = floor(y), bz = floor(z);
    real fx = x - bx, fy = y - by, fz = z - bz;
    int i0 = (int)bx, j0 = (int)by, k0 = (int)bz;
    int ci[2] = {i0, min(i0 + 1, g.nx - 1)};
    int cj[2] = {j0, min(j0 + 1, g.ny - 1)};
    int ck[2] = {k0, min(k0 + 1, g.nz - 1)};
    real wx[2] = {(real)1.0 - fx, fx}, wy[2] = {(real)1.0 - fy, fy}, wz[2] = {(real)1.0 - fz, fz};
#pragma unroll
    for (int c = 0; c < 4 * COUNT; ++c) out[c] = 0.0;
#pragma unroll
    for (int a = 0; a < 2; ++a)
#pragma unroll
        for (int b = 0; b < 2; ++b)
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                long long v = (((long long)ci[a] * g.ny + cj[b]) * g.nz + ck[c]) * STRIDE;
                real w = wx[a] * wy[b] * wz[c];
#pragma unroll
                for (int k = 0; k < COUNT; ++k) {
                    float4 q = __ldg(field + v + k);
                    out[4 * k] += w * q.x; out[4 * k + 1] += w * q.y;
                    out[4 * k + 2] += w * q.z; out[4 * k + 3] += w * q.w;
                }
            }
}

// The six tensor components of a field of 8 floats per voxel (the deterministic tracker's).
__device__ __forceinline__ void trilinear_tensor(const float4* __restrict__ field, Grid g, R3 p, real t[6]) {
    real out[8];
    trilinear_f4<2, 2>(field, g, p, out);
#pragma unroll
    for (int c = 0; c < 6; ++c) t[c] = out[c];
}
