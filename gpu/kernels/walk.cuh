// The walk's rules that the streamline trackers share (deterministic.cu, fod_tracking.cu;
// gpu/tracking.py's walk is their reference); needs tracking.cuh before it. A thread's row of
// points holds the seed at index m, forward point k at m + k, backward point k at m - k;
// `count` and `stop` hold two entries per seed (backward, forward).

#ifndef MAX_LENGTH
#error "MAX_LENGTH is a compile-time constant defined by gpu/tracking.py"
#endif
#ifndef OUTSIDE_VOLUME
#error "OUTSIDE_VOLUME is a compile-time constant defined by gpu/tracking.py"
#endif
#ifndef OUTSIDE_MASK
#error "OUTSIDE_MASK is a compile-time constant defined by gpu/tracking.py"
#endif
#ifndef STOP_REGION
#error "STOP_REGION is a compile-time constant defined by gpu/tracking.py"
#endif
#ifndef REGION_OUTSIDE
#error "REGION_OUTSIDE is a compile-time constant defined by gpu/tracking.py"
#endif
#ifndef REGION_STOP
#error "REGION_STOP is a compile-time constant defined by gpu/tracking.py"
#endif

// Writes the seed into its row and zero step counts; returns why the seed cannot start (outside
// the volume or the mask), 0 when it can.
__device__ __forceinline__ unsigned char start_row(float* row, int m, R3 p0, const unsigned char* region, Grid g,
                                                   int* counts) {
    row[3 * m] = p0.x; row[3 * m + 1] = p0.y; row[3 * m + 2] = p0.z;
    counts[0] = 0;
    counts[1] = 0;
    if (!inside_volume(p0, g)) return OUTSIDE_VOLUME;
    if (region[nearest_voxel(p0, g)] == REGION_OUTSIDE) return OUTSIDE_MASK;
    return 0;
}

// The step to q of half `end` (1 forward, 0 backward): outside the volume or the mask → that stop
// code, q not taken; else q is appended (++*steps) and a stop region gives STOP_REGION; 0: go on.
__device__ __forceinline__ unsigned char take_step(R3 q, int end, int m, float* row, const unsigned char* region,
                                                   Grid g, int* steps) {
    if (!inside_volume(q, g)) return OUTSIDE_VOLUME;
    unsigned char code = region[nearest_voxel(q, g)];
    if (code == REGION_OUTSIDE) return OUTSIDE_MASK;
    ++*steps;
    size_t at = (size_t)3 * (end == 1 ? m + *steps : m - *steps);
    row[at] = q.x; row[at + 1] = q.y; row[at + 2] = q.z;
    return code == REGION_STOP ? STOP_REGION : 0;
}

// Both halves of one seed's streamline, forward along d0 first, then backward with what is left
// of the length budget: at every step the length budget, take_step's rules, then the method's
// `turn(q, v, end, steps, &e)` (0: go on along e, else the stop code); `advance(p, d)` gives the
// direction of the step from p entered along d. Writes the halves' step counts and stop codes.
template <class Method>
__device__ __forceinline__ void walk_halves(const Method& method, R3 p0, R3 d0, R3 h, int m, float* row,
                                            const unsigned char* region, Grid g, int* counts, unsigned char* stops) {
    int forward_steps = 0;
    for (int end = 1; end >= 0; --end) {
        const int budget = end == 1 ? m : m - forward_steps;
        R3 p = p0;
        R3 d = end == 1 ? d0 : scale3r(d0, (real)-1.0);
        int steps = 0;
        unsigned char reason = 0;
        while (true) {
            if (steps >= budget) { reason = MAX_LENGTH; break; }
            R3 v = method.advance(p, d);
            R3 q = add3r(p, mul3r(h, v));
            if ((reason = take_step(q, end, m, row, region, g, &steps))) break;
            R3 e;
            if ((reason = method.turn(q, v, end, steps, &e))) break;
            p = q;
            d = e;
        }
        counts[end] = steps;
        stops[end] = reason;
        if (end == 1) forward_steps = steps;
    }
}
