// Gather the used span of each kept row of a tracking buffer (points of `width` floats:
// 3 for positions, 1 for a scalar) into one packed array: one warp per streamline,
// lanes copying consecutive floats (coalesced).
// gpu/streamlines.py (pack_rows) has the NumPy equivalent.
extern "C" __global__ void pack_rows(const float* __restrict__ buf, long long row_floats,
                                     const long long* __restrict__ rows, const long long* __restrict__ first,
                                     const long long* __restrict__ offsets, int n_rows, int width,
                                     float* __restrict__ out) {
    long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (warp >= n_rows) return;
    const float* src = buf + rows[warp] * row_floats + width * first[warp];
    float* dst = out + width * offsets[warp];
    long long n = width * (offsets[warp + 1] - offsets[warp]);
    for (long long k = lane; k < n; k += 32) dst[k] = src[k];
}
