// Probabilistic tractography, probtrackx style: the algorithm of gpu/probabilistic.py
// (its track_numpy is the reference), one thread per streamline (both halves), persistent
// threads taking the next streamline from a counter. Positions and directions are in
// double so the step sequences equal the reference's; random numbers are the same
// Philox4x32-10 streams.
//
// Each thread owns a small open-addressing hash set of voxel numbers (table + list of
// members, in global memory) holding the voxels its current streamline has visited:
// it makes the path distribution count a voxel once per streamline and serves the loop
// check. After a streamline, a kept one adds its list to the path distribution, and the
// table is cleared through the list.

#define BIT_BRAIN 1u
#define BIT_EXCLUDE 2u
#define BIT_STOP 4u
#define TARGET_SHIFT 11
#define P_STEP 0u
#define P_START 1u
#define P_EULER 2u
#define P_RANDFIB 3u

// The streamline's random numbers: philox4x32_10 (philox.cuh) at counter (draw, purpose | half << 8, id).
__device__ __forceinline__ uint4 philox(unsigned int c0, unsigned int c1, unsigned long long sid, unsigned int k0,
                                        unsigned int k1) {
    return philox4x32_10(make_uint4(c0, c1, (unsigned int)sid, (unsigned int)(sid >> 32)), k0, k1);
}

__device__ __forceinline__ double uniform(unsigned int r) { return ((double)r + 0.5) * 2.3283064365386963e-10; }

struct Params {
    int nx, ny, nz, S, L, n_steps, randfib, loopcheck, modeuler, cap;
    double sx, sy, sz, cthr, fibthresh;  // step in voxels per axis
    unsigned int k0, k1;
};

// A direction drawn at position p (see _sample_direction in gpu/probabilistic.py); zero if none.
__device__ void sample_direction(const Params& P, const float* __restrict__ dirs, const float* __restrict__ fr,
                                 const int* __restrict__ index, double px, double py, double pz, double qx, double qy,
                                 double qz, bool has_prev, uint4 r, unsigned int fib_r, double* d) {
    double bx = floor(px), by = floor(py), bz = floor(pz);
    int vx = (int)bx + (uniform(r.x) < px - bx), vy = (int)by + (uniform(r.y) < py - by),
        vz = (int)bz + (uniform(r.z) < pz - bz);
    int cx = min(max((int)rint(px), 0), P.nx - 1), cy = min(max((int)rint(py), 0), P.ny - 1),
        cz = min(max((int)rint(pz), 0), P.nz - 1);
    bool inside = vx >= 0 && vx < P.nx && vy >= 0 && vy < P.ny && vz >= 0 && vz < P.nz;
    if (!inside) { vx = cx; vy = cy; vz = cz; }
    int row = index[(vx * P.ny + vy) * P.nz + vz];
    if (row < 0) row = index[(cx * P.ny + cy) * P.nz + cz];
    d[0] = d[1] = d[2] = 0.0;
    if (row < 0) return;
    int s = (int)__umulhi(r.w, (unsigned int)P.S);
    const float* dv = dirs + ((size_t)row * P.S + s) * P.L * 3;
    const float* fv = fr + ((size_t)row * P.S + s) * P.L;
    int choice = 0;
    if (has_prev) {
        double best = -1.0;
        for (int i = 0; i < P.L; ++i) {
            if (fv[i] > P.fibthresh) {
                double dot = fabs((double)dv[3 * i] * qx + (double)dv[3 * i + 1] * qy + (double)dv[3 * i + 2] * qz);
                if (dot > best) { best = dot; choice = i; }
            }
        }
    } else if (P.randfib) {
        double total = 0.0;
        for (int i = 0; i < P.L; ++i)
            if (fv[i] > P.fibthresh) total += P.randfib == 1 ? 1.0 : (double)fv[i];
        if (total > 0.0) {
            double pick = uniform(fib_r) * total, cum = 0.0;
            int count = 0;
            for (int i = 0; i < P.L; ++i) {
                if (fv[i] > P.fibthresh) cum += P.randfib == 1 ? 1.0 : (double)fv[i];
                if (cum <= pick) ++count;
            }
            choice = min(count, P.L - 1);
        }
    }
    d[0] = dv[3 * choice]; d[1] = dv[3 * choice + 1]; d[2] = dv[3 * choice + 2];
}

// Insert voxel v into the thread's set; 1 if new, 0 if present, -1 if full.
__device__ __forceinline__ int set_insert(int* table, int* list, int& size, int cap, int v) {
    unsigned int h = ((unsigned int)v * 2654435761u) & (unsigned int)(cap - 1);
    while (true) {
        int slot = table[h];
        if (slot == v) return 0;
        if (slot < 0) {
            if (2 * (size + 1) > cap) return -1;
            table[h] = v;
            list[size++] = v;
            return 1;
        }
        h = (h + 1) & (unsigned int)(cap - 1);
    }
}

__device__ __forceinline__ bool set_contains(const int* table, int cap, int v) {
    unsigned int h = ((unsigned int)v * 2654435761u) & (unsigned int)(cap - 1);
    while (true) {
        int slot = table[h];
        if (slot == v) return true;
        if (slot < 0) return false;
        h = (h + 1) & (unsigned int)(cap - 1);
    }
}

extern "C" __global__ void prob_track(
    const float* __restrict__ dirs, const float* __restrict__ fr, const int* __restrict__ index,
    const unsigned int* __restrict__ bits, const int* __restrict__ seeds, long long n_streamlines, int n_samples,
    long long first_id, int nx, int ny, int nz, int S, int L, int n_steps, int randfib, int loopcheck, int modeuler,
    int cap, double step_x, double step_y, double step_z, double cthr, double fibthresh, unsigned int k0,
    unsigned int k1, int n_targets, unsigned int waymask, int way_and, unsigned long long* next,
    int* __restrict__ tables, int* __restrict__ lists, unsigned long long* __restrict__ paths,
    unsigned long long* __restrict__ seed_targets, unsigned long long* __restrict__ totals,  // kept, overflow
    double* __restrict__ trace)  // optional (n, 2, n_steps + 1, 4): x, y, z, alive
{
    const Params P = {nx, ny, nz, S, L, n_steps, randfib, loopcheck, modeuler, cap,
                      step_x, step_y, step_z, cthr, fibthresh, k0, k1};
    long long thread = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    int* table = tables + thread * P.cap;
    int* list = lists + thread * P.cap;
    while (true) {
        long long local = (long long)atomicAdd(next, 1ull);
        if (local >= n_streamlines) return;
        unsigned long long sid = (unsigned long long)(first_id + local);
        long long seed_no = (first_id + local) / n_samples;
        uint4 j = philox(0u, P_START, sid, P.k0, P.k1);
        double sx0 = seeds[3 * seed_no] + uniform(j.x) - 0.5, sy0 = seeds[3 * seed_no + 1] + uniform(j.y) - 0.5,
               sz0 = seeds[3 * seed_no + 2] + uniform(j.z) - 0.5;
        int size = 0, overflow = 0;
        unsigned int hits = 0;
        bool excluded = false;
        int ix = (int)rint(sx0), iy = (int)rint(sy0), iz = (int)rint(sz0);
        bool in_grid = ix >= 0 && ix < P.nx && iy >= 0 && iy < P.ny && iz >= 0 && iz < P.nz;
        int start_voxel = in_grid ? (ix * P.ny + iy) * P.nz + iz : -1;
        if (in_grid) {
            hits |= bits[start_voxel];
            if (set_insert(table, list, size, P.cap, start_voxel) < 0) overflow = 1;
        }
        excluded = (hits & BIT_EXCLUDE) != 0;
        double fx = 0, fy = 0, fz = 0;
        bool first_taken = false;
        for (int half = 0; half < 2; ++half) {
            double px = sx0, py = sy0, pz = sz0;
            double qx = half ? -fx : 0.0, qy = half ? -fy : 0.0, qz = half ? -fz : 0.0;
            bool has_prev = half ? first_taken : false;
            bool alive = in_grid && (hits & BIT_BRAIN) && !excluded;
            int current = start_voxel;
            double* tr = trace ? trace + ((size_t)local * 2 + half) * (P.n_steps + 1) * 4 : nullptr;
            if (tr) { tr[0] = px; tr[1] = py; tr[2] = pz; tr[3] = alive; }
            for (int step = 0; step < P.n_steps; ++step) {
                if (alive) {
                    unsigned int c1 = (unsigned int)half << 8;
                    uint4 r = philox((unsigned int)step, P_STEP | c1, sid, P.k0, P.k1);
                    unsigned int fib = P.randfib ? philox((unsigned int)step, P_RANDFIB | c1, sid, P.k0, P.k1).x : 0u;
                    double d[3];
                    sample_direction(P, dirs, fr, index, px, py, pz, qx, qy, qz, has_prev, r, fib, d);
                    double cosine = d[0] * qx + d[1] * qy + d[2] * qz;
                    if (has_prev && cosine < 0) { d[0] = -d[0]; d[1] = -d[1]; d[2] = -d[2]; }
                    bool zero = !(fabs(d[0]) + fabs(d[1]) + fabs(d[2]) > 0);
                    bool turn = has_prev && fabs(cosine) < P.cthr;
                    if (P.modeuler) {
                        uint4 r2 = philox((unsigned int)step, P_EULER | c1, sid, P.k0, P.k1);
                        double d2[3];
                        sample_direction(P, dirs, fr, index, px + d[0] * P.sx, py + d[1] * P.sy, pz + d[2] * P.sz, d[0],
                                         d[1], d[2], true, r2, r2.x, d2);
                        if (d2[0] * d[0] + d2[1] * d[1] + d2[2] * d[2] < 0) { d2[0] = -d2[0]; d2[1] = -d2[1]; d2[2] = -d2[2]; }
                        double mx = d[0] + d2[0], my = d[1] + d2[1], mz = d[2] + d2[2];
                        double norm = sqrt(mx * mx + my * my + mz * mz);
                        if (norm > 0) { d[0] = mx / norm; d[1] = my / norm; d[2] = mz / norm; }
                    }
                    alive = !zero && !turn;
                    double nx = px + d[0] * P.sx, ny = py + d[1] * P.sy, nz = pz + d[2] * P.sz;
                    int vx = (int)rint(nx), vy = (int)rint(ny), vz = (int)rint(nz);
                    bool inside = vx >= 0 && vx < P.nx && vy >= 0 && vy < P.ny && vz >= 0 && vz < P.nz;
                    int v = inside ? (vx * P.ny + vy) * P.nz + vz : -1;
                    unsigned int b = inside ? bits[v] : 0u;
                    alive = alive && inside && (b & BIT_BRAIN);
                    if (alive) {
                        px = nx; py = ny; pz = nz;
                        if (half == 0 && !first_taken) { fx = d[0]; fy = d[1]; fz = d[2]; first_taken = true; }
                        qx = d[0]; qy = d[1]; qz = d[2];
                        has_prev = true;
                        hits |= b;
                        if (b & BIT_EXCLUDE) { excluded = true; alive = false; }
                    }
                    if (alive && v != current) {
                        if (P.loopcheck && set_contains(table, P.cap, v)) {
                            alive = false;
                        } else {
                            if (set_insert(table, list, size, P.cap, v) < 0) overflow = 1;
                            current = v;
                        }
                    }
                    if (alive && (b & BIT_STOP)) alive = false;
                }
                if (tr) {
                    double* t = tr + (step + 1) * 4;
                    t[0] = px; t[1] = py; t[2] = pz; t[3] = alive;
                }
                if (!alive && !tr) break;
            }
        }
        bool kept = !excluded && (waymask == 0 || (way_and ? (hits & waymask) == waymask : (hits & waymask) != 0));
        for (int i = 0; i < size; ++i) {
            if (kept) atomicAdd(paths + list[i], 1ull);
            unsigned int h = ((unsigned int)list[i] * 2654435761u) & (unsigned int)(P.cap - 1);
            while (table[h] != list[i]) h = (h + 1) & (unsigned int)(P.cap - 1);
            table[h] = -1;
        }
        // (The search above does not stop at slots emptied before it, so it finds every member.)
        if (kept) {
            atomicAdd(totals, 1ull);
            for (int t = 0; t < n_targets; ++t)
                if ((hits >> (TARGET_SHIFT + t)) & 1u) atomicAdd(seed_targets + seed_no * n_targets + t, 1ull);
        }
        if (overflow) atomicAdd(totals + 1, 1ull);
    }
}
