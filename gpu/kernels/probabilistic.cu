// Probabilistic tractography, probtrackx style: the algorithm of gpu/probabilistic.py
// (its track_numpy is the reference), one thread per streamline (both halves). Positions
// and directions are in double so the step sequences equal the reference's; random
// numbers are the same Philox4x32-10 streams.
//
// Persistent threads, each a small state machine: every pass of its loop makes one step
// of its current half, or starts the next half, or finishes the streamline and takes
// the next from a counter. Lanes of a warp therefore step together whatever the lengths
// of their streamlines (a loop over steps inside a loop over streamlines would leave the
// lanes of short streamlines idle until the warp's longest one ends).
//
// Streamlines are taken in the order j = k * n_seeds + seed (sample k of every seed
// voxel before sample k + 1), so the threads running at a time start in different seed
// voxels and do not all add to the same few voxels of the path distribution; the
// streamline's random stream is keyed by its id seed * n_samples + k as in the reference.
//
// Each thread owns an open-addressing hash set of the voxels its streamline has
// visited (counting once, and the loop check). Entries are (stamp << 32 | voxel), the
// stamp being the thread's streamline number, so a new streamline finds the table empty
// without clearing it. When the streamline can only be kept (no waypoints, no
// exclusion: `immediate`), a voxel is added to the path distribution when it enters the
// set; otherwise the thread lists the members and adds them at the end if the
// streamline is kept. A streamline with more than `limit` distinct voxels is abandoned
// and its id written to `overflow_ids`; a second launch (queued right after, its count
// read on the device) runs those again with a table large enough for any streamline and
// `rank_from` = the voxels already added (immediate) or 0.

// Mask bits, random stream purposes and SEED_MATRIX (1: count the seed x seed matrix),
// passed by gpu/probabilistic.py (kernel_defines).
#ifndef SEED_MATRIX
#error "SEED_MATRIX is a compile-time constant defined by gpu/probabilistic.py"
#endif
// VISIT_LIST (1: every kept streamline appends its distinct voxels, with its id, to
// visit_sid / visit_voxel for the connectome modes of gpu/connectome.py; needs the member
// lists, so the host runs it with immediate = 0).
#ifndef VISIT_LIST
#error "VISIT_LIST is a compile-time constant defined by gpu/probabilistic.py"
#endif
#ifndef BIT_BRAIN
#error "BIT_BRAIN is a compile-time constant defined by gpu/probabilistic.py"
#endif
#ifndef BIT_EXCLUDE
#error "BIT_EXCLUDE is a compile-time constant defined by gpu/probabilistic.py"
#endif
#ifndef BIT_STOP
#error "BIT_STOP is a compile-time constant defined by gpu/probabilistic.py"
#endif
#ifndef TARGET_SHIFT
#error "TARGET_SHIFT is a compile-time constant defined by gpu/probabilistic.py"
#endif
#ifndef P_STEP
#error "P_STEP is a compile-time constant defined by gpu/probabilistic.py"
#endif
#ifndef P_START
#error "P_START is a compile-time constant defined by gpu/probabilistic.py"
#endif
#ifndef P_EULER
#error "P_EULER is a compile-time constant defined by gpu/probabilistic.py"
#endif
#ifndef P_RANDFIB
#error "P_RANDFIB is a compile-time constant defined by gpu/probabilistic.py"
#endif

typedef unsigned long long u64;

// The streamline's random numbers: philox4x32_10 (philox.cuh) at counter (draw, purpose | half << 8, id).
__device__ __forceinline__ uint4 philox(unsigned int c0, unsigned int c1, u64 sid, unsigned int k0, unsigned int k1) {
    return philox4x32_10(make_uint4(c0, c1, (unsigned int)sid, (unsigned int)(sid >> 32)), k0, k1);
}

__device__ __forceinline__ double uniform(unsigned int r) { return ((double)r + 0.5) * 2.3283064365386963e-10; }

struct Params {
    int nx, ny, nz, S, L, n_steps, randfib, loopcheck, modeuler;
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
    int row = __ldg(index + (vx * P.ny + vy) * P.nz + vz);
    if (row < 0) row = __ldg(index + (cx * P.ny + cy) * P.nz + cz);
    d[0] = d[1] = d[2] = 0.0;
    if (row < 0) return;
    int s = (int)__umulhi(r.w, (unsigned int)P.S);
    const float* dv = dirs + ((size_t)row * P.S + s) * P.L * 3;
    const float* fv = fr + ((size_t)row * P.S + s) * P.L;
    int choice = 0;
    if (has_prev) {
        double best = -1.0;
        for (int i = 0; i < P.L; ++i) {
            if (__ldg(fv + i) > P.fibthresh) {
                double dot = fabs((double)__ldg(dv + 3 * i) * qx + (double)__ldg(dv + 3 * i + 1) * qy +
                                  (double)__ldg(dv + 3 * i + 2) * qz);
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
    d[0] = __ldg(dv + 3 * choice); d[1] = __ldg(dv + 3 * choice + 1); d[2] = __ldg(dv + 3 * choice + 2);
}

// Voxel v in the thread's set (entries of other stamps are empty): 1 if added, 0 if there, -1 if full.
__device__ __forceinline__ int set_insert(u64* table, int cap, int limit, int& size, unsigned int stamp, int v) {
    unsigned int h = ((unsigned int)v * 2654435761u) & (unsigned int)(cap - 1);
    while (true) {
        u64 e = table[h];
        if ((unsigned int)(e >> 32) != stamp) {
            if (size >= limit) return -1;
            table[h] = ((u64)stamp << 32) | (unsigned int)v;
            ++size;
            return 1;
        }
        if ((int)(unsigned int)e == v) return 0;
        h = (h + 1) & (unsigned int)(cap - 1);
    }
}

__device__ __forceinline__ bool set_contains(const u64* table, int cap, unsigned int stamp, int v) {
    unsigned int h = ((unsigned int)v * 2654435761u) & (unsigned int)(cap - 1);
    while (true) {
        u64 e = table[h];
        if ((unsigned int)(e >> 32) != stamp) return false;
        if ((int)(unsigned int)e == v) return true;
        h = (h + 1) & (unsigned int)(cap - 1);
    }
}

// A kept streamline from seed voxel `seed_no` counts voxel v (once).
__device__ __forceinline__ void visit(u64* paths, const int* seed_number, unsigned int* seed_matrix, long long n_seeds,
                                      long long seed_no, int v) {
    atomicAdd(paths + v, 1ull);
#if SEED_MATRIX  // compiled in only when asked for (it costs registers)
    int other = __ldg(seed_number + v);
    if (other >= 0) atomicAdd(seed_matrix + seed_no * n_seeds + other, 1u);
#endif
}

extern "C" __global__ void prob_track(
    const float* __restrict__ dirs, const float* __restrict__ fr, const int* __restrict__ index,
    const unsigned int* __restrict__ bits, const int* __restrict__ seeds, long long n_streamlines,
    const u64* __restrict__ n_device,  // non-null: the number of streamlines is *n_device (a second pass)
    const u64* __restrict__ ids,       // null: streamline `local` is run position first + local
    long long first, int n_samples, long long n_seeds, int nx, int ny, int nz, int S, int L, int n_steps, int randfib,
    int loopcheck, int modeuler, int cap, int limit, unsigned int stamp_base, double step_x, double step_y,
    double step_z, double cthr, double fibthresh, unsigned int k0, unsigned int k1, int n_targets,
    unsigned int waymask, int way_and, int immediate, int rank_from, u64* next, u64* __restrict__ tables,
    int* __restrict__ lists, u64* __restrict__ paths, u64* __restrict__ seed_targets,
    u64* __restrict__ counters,      // kept, abandoned (over `limit`) in this launch, in all launches, steps
    u64* __restrict__ overflow_ids,  // ids of the abandoned streamlines (at most overflow_capacity)
    long long overflow_capacity,
    const int* __restrict__ seed_number,    // optional: per grid voxel its seed voxel number, -1 if none
    unsigned int* __restrict__ seed_matrix,  // with seed_number: (n_seeds, n_seeds) seed x seed counts
    double* __restrict__ trace  // optional (n, 2, n_steps + 1, 4): x, y, z, alive
#if VISIT_LIST
    ,
    u64* __restrict__ visit_sid,    // (visit_capacity,) the streamline id of each visit
    int* __restrict__ visit_voxel,  // (visit_capacity,) its voxel; a streamline's visits are contiguous
    u64* __restrict__ visit_count,  // visits appended (may exceed visit_capacity: the host runs again)
    long long visit_capacity
#endif
    )
{
    const Params P = {nx, ny, nz, S, L, n_steps, randfib, loopcheck, modeuler,
                      step_x, step_y, step_z, cthr, fibthresh, k0, k1};
    const long long thread = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    u64* table = tables + thread * cap;
    int* list = lists ? lists + thread * cap : nullptr;
    unsigned int stamp = stamp_base;  // tables hold stamps up to stamp_base from earlier launches
    if (n_device) n_streamlines = (long long)*n_device;
    // The streamline's state.
    long long local = 0, seed_no = 0;
    u64 sid = 0;
    double sx0 = 0, sy0 = 0, sz0 = 0, px = 0, py = 0, pz = 0, qx = 0, qy = 0, qz = 0, fx = 0, fy = 0, fz = 0;
    int half = 1, step = 0, size = 0, current = -1, start_voxel = -1, moves = 0;
    unsigned int hits = 0;
    bool alive = false, has_prev = false, first_taken = false, excluded = false, in_grid = false, over = false;
    bool active = false;
    double* tr = nullptr;

    while (true) {
        if (!active) {
            local = (long long)atomicAdd(next, 1ull);
            if (local >= n_streamlines) return;
            if (ids) {
                sid = ids[local];
                seed_no = (long long)(sid / (u64)n_samples);
            } else {
                long long j = first + local;
                seed_no = j % n_seeds;
                sid = (u64)(seed_no * n_samples + j / n_seeds);
            }
            ++stamp;
            tr = nullptr;
            uint4 r = philox(0u, P_START, sid, P.k0, P.k1);
            sx0 = seeds[3 * seed_no] + uniform(r.x) - 0.5;
            sy0 = seeds[3 * seed_no + 1] + uniform(r.y) - 0.5;
            sz0 = seeds[3 * seed_no + 2] + uniform(r.z) - 0.5;
            size = 0;
            moves = 0;
            hits = 0;
            over = false;
            first_taken = false;
            int ix = (int)rint(sx0), iy = (int)rint(sy0), iz = (int)rint(sz0);
            in_grid = ix >= 0 && ix < P.nx && iy >= 0 && iy < P.ny && iz >= 0 && iz < P.nz;
            start_voxel = in_grid ? (ix * P.ny + iy) * P.nz + iz : -1;
            if (in_grid) {
                hits = bits[start_voxel];
                set_insert(table, cap, limit, size, stamp, start_voxel);  // limit >= 1
                if (list) list[0] = start_voxel;
                if (immediate && rank_from == 0) visit(paths, seed_number, seed_matrix, n_seeds, seed_no, start_voxel);
            }
            excluded = (hits & BIT_EXCLUDE) != 0;
            half = -1;  // the first half starts below
            alive = false;
            step = n_steps;
            active = true;
        }
        if (alive && step < P.n_steps) {
            const unsigned int c1 = (unsigned int)half << 8;
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
                sample_direction(P, dirs, fr, index, px + d[0] * P.sx, py + d[1] * P.sy, pz + d[2] * P.sz, d[0], d[1],
                                 d[2], true, r2, r2.x, d2);
                if (d2[0] * d[0] + d2[1] * d[1] + d2[2] * d[2] < 0) { d2[0] = -d2[0]; d2[1] = -d2[1]; d2[2] = -d2[2]; }
                double mx = d[0] + d2[0], my = d[1] + d2[1], mz = d[2] + d2[2];
                double norm = sqrt(mx * mx + my * my + mz * mz);
                if (norm > 0) { d[0] = mx / norm; d[1] = my / norm; d[2] = mz / norm; }
            }
            alive = !zero && !turn;
            double nx_ = px + d[0] * P.sx, ny_ = py + d[1] * P.sy, nz_ = pz + d[2] * P.sz;
            int vx = (int)rint(nx_), vy = (int)rint(ny_), vz = (int)rint(nz_);
            bool inside = vx >= 0 && vx < P.nx && vy >= 0 && vy < P.ny && vz >= 0 && vz < P.nz;
            int v = inside ? (vx * P.ny + vy) * P.nz + vz : -1;
            unsigned int b = inside ? __ldg(bits + v) : 0u;
            alive = alive && inside && (b & BIT_BRAIN);
            if (alive) {
                ++moves;
                px = nx_; py = ny_; pz = nz_;
                if (half == 0 && !first_taken) { fx = d[0]; fy = d[1]; fz = d[2]; first_taken = true; }
                qx = d[0]; qy = d[1]; qz = d[2];
                has_prev = true;
                hits |= b;
                if (b & BIT_EXCLUDE) { excluded = true; alive = false; }
            }
            if (alive && v != current) {
                if (P.loopcheck && set_contains(table, cap, stamp, v)) {
                    alive = false;
                } else {
                    int rank = size;
                    int added = set_insert(table, cap, limit, size, stamp, v);
                    if (added < 0) {
                        over = true;  // abandoned: the host tracks it again with a larger table
                        alive = false;
                        half = 1;
                    } else if (added) {
                        if (list) list[rank] = v;
                        if (immediate && rank >= rank_from) visit(paths, seed_number, seed_matrix, n_seeds, seed_no, v);
                    }
                    current = v;
                }
            }
            if (alive && (b & BIT_STOP)) alive = false;
            ++step;
            if (tr) {
                double* t = tr + step * 4;
                t[0] = px; t[1] = py; t[2] = pz; t[3] = alive;
            }
            continue;
        }
        // The current half is over (or the streamline has just been taken).
        if (tr) {
            for (int s = step + 1; s <= P.n_steps; ++s) {
                double* t = tr + s * 4;
                t[0] = px; t[1] = py; t[2] = pz; t[3] = 0.0;
            }
        }
        if (half < 1) {
            half += 1;
            px = sx0; py = sy0; pz = sz0;
            qx = half ? -fx : 0.0; qy = half ? -fy : 0.0; qz = half ? -fz : 0.0;
            has_prev = half ? first_taken : false;
            alive = in_grid && (hits & BIT_BRAIN) && !excluded;
            current = start_voxel;
            step = 0;
            tr = trace ? trace + ((size_t)local * 2 + half) * (P.n_steps + 1) * 4 : nullptr;
            if (tr) { tr[0] = px; tr[1] = py; tr[2] = pz; tr[3] = alive; }
            continue;
        }
        active = false;
        if (over) {
            u64 slot = atomicAdd(counters + 1, 1ull);
            atomicAdd(counters + 2, 1ull);
            if (slot < (u64)overflow_capacity) overflow_ids[slot] = sid;
            continue;
        }
        atomicAdd(counters + 3, (u64)moves);
        bool kept = !excluded && (waymask == 0 || (way_and ? (hits & waymask) == waymask : (hits & waymask) != 0));
        if (!kept) continue;
        if (!immediate)
            for (int i = rank_from; i < size; ++i) visit(paths, seed_number, seed_matrix, n_seeds, seed_no, list[i]);
#if VISIT_LIST
        {
            u64 base = atomicAdd(visit_count, (u64)size);
            for (int i = 0; i < size; ++i) {
                if (base + i >= (u64)visit_capacity) break;
                visit_sid[base + i] = sid;
                visit_voxel[base + i] = list[i];
            }
        }
#endif
        atomicAdd(counters, 1ull);
        for (int t = 0; t < n_targets; ++t)
            if ((hits >> (TARGET_SHIFT + t)) & 1u) atomicAdd(seed_targets + seed_no * n_targets + t, 1ull);
    }
}
