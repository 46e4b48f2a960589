// Region bits per streamline: one thread per point of the batch. The thread ORs
// the bits of the voxel holding its point and, unless the point ends its
// streamline, of every voxel the segment to the next point crosses, then
// atomicOr's them into its streamline's word. Same traversal as the NumPy
// reference in gpu/select.py: pieces of at most one voxel per axis, each
// crossing at most one boundary plane per axis, looked up at the midpoints of
// the intervals between the crossings.

__device__ __forceinline__ unsigned int lookup(const unsigned int* bits, int nx, int ny, int nz,
                                               float x, float y, float z) {
    int i = (int)floorf(x + 0.5f), j = (int)floorf(y + 0.5f), k = (int)floorf(z + 0.5f);
    if (i < 0 || j < 0 || k < 0 || i >= nx || j >= ny || k >= nz) return 0u;
    return bits[((long long)i * ny + j) * nz + k];  // C order, as NumPy stores it
}

__device__ __forceinline__ float crossing(float p, float q) {
    float lo = fminf(p, q);
    float plane = floorf(lo + 0.5f) + 0.5f;
    float d = q - p;
    return (plane < fmaxf(p, q) && d != 0.0f) ? (plane - p) / d : 1.0f;
}

__device__ __forceinline__ bool misses(float p, float q, int lo, int hi) {
    // The voxels between p and q along one axis (rounded as lookup does, one voxel of margin
    // for the rounding of the points in between) all lie outside lo..hi.
    return floorf(fmaxf(p, q) + 0.5f) < (float)(lo - 1) || floorf(fminf(p, q) + 0.5f) > (float)(hi + 1);
}

// lo*/hi*: the inclusive voxel box that holds every region's voxels. A point whose segment
// stays outside it on one axis looks nothing up: most of a whole-brain tractogram, for an ROI
// (the lookups, not the reading of the points, were most of the kernel's time).
extern "C" __global__ void streamline_region_bits(
    const float* points, const int* stream_of_point, const unsigned char* is_last, long long n_points,
    const unsigned int* bits, int nx, int ny, int nz,
    int lox, int loy, int loz, int hix, int hiy, int hiz, unsigned int* out)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_points) return;
    float px = points[3 * i], py = points[3 * i + 1], pz = points[3 * i + 2];
    bool last = is_last[i];
    float qx = px, qy = py, qz = pz;
    if (!last) { qx = points[3 * i + 3]; qy = points[3 * i + 4]; qz = points[3 * i + 5]; }
    if (misses(px, qx, lox, hix) || misses(py, qy, loy, hiy) || misses(pz, qz, loz, hiz)) return;
    unsigned int hit = lookup(bits, nx, ny, nz, px, py, pz);
    if (!last) {
        float dx = qx - px, dy = qy - py, dz = qz - pz;
        int pieces = max(1, (int)ceilf(fmaxf(fabsf(dx), fmaxf(fabsf(dy), fabsf(dz)))));
        for (int k = 0; k < pieces; ++k) {
            float t0 = (float)k / pieces, t1 = (float)(k + 1) / pieces;
            float ax = px + dx * t0, ay = py + dy * t0, az = pz + dz * t0;
            float bx = px + dx * t1, by = py + dy * t1, bz = pz + dz * t1;
            float t[3] = {crossing(ax, bx), crossing(ay, by), crossing(az, bz)};
            // Sort the three crossing parameters.
            if (t[0] > t[1]) { float s = t[0]; t[0] = t[1]; t[1] = s; }
            if (t[1] > t[2]) { float s = t[1]; t[1] = t[2]; t[2] = s; }
            if (t[0] > t[1]) { float s = t[0]; t[0] = t[1]; t[1] = s; }
            float edges[5] = {0.0f, t[0], t[1], t[2], 1.0f};
            float ex = bx - ax, ey = by - ay, ez = bz - az;
            #pragma unroll
            for (int m = 0; m < 4; ++m) {
                float mid = 0.5f * (edges[m] + edges[m + 1]);
                hit |= lookup(bits, nx, ny, nz, ax + ex * mid, ay + ey * mid, az + ez * mid);
            }
        }
    }
    if (hit) atomicOr(&out[stream_of_point[i]], hit);
}
