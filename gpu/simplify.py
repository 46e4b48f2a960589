"""Streamlines simplified for drawing within a distance bound, on NumPy or CuPy alike.

In pass ``L`` (``h = 2^(L-1)``) every streamline is cut into intervals ``[base, base + 2h]`` of
its own point numbers (the last one ends at the streamline's last point). The point at
``base + h`` of an interval is dropped when every other point strictly inside the interval is
dropped already and every point strictly inside (itself included) lies within ``tolerance`` of the
segment between the interval's ends: so each dropped point is within the tolerance of the
segment drawn in its place, and the first and last points stay. Each pass is a few elementwise
operations over all points (no loop over streamlines), so a block of millions of points is a
few dozen kernels on the GPU. At most ``2^passes`` times fewer points.
"""

from __future__ import annotations

from .indices import flatnonzero


def simplify_block(xp, points, lengths, tolerance: float, passes: int):
    """(kept point indices int64 ascending, kept point count per streamline int64) of the
    streamlines of ``lengths`` (int64, their points consecutive in ``points`` (P, 3) float32, P
    their sum), simplified within ``tolerance`` (the points' units): see the module's text."""
    n = int(points.shape[0])
    count = int(lengths.shape[0])
    if n == 0:
        return xp.zeros(0, dtype=xp.int64), xp.zeros(count, dtype=xp.int64)
    owner = xp.repeat(xp.arange(count, dtype=xp.int64), lengths)
    starts = xp.cumsum(lengths) - lengths
    first = starts[owner]
    local = xp.arange(n, dtype=xp.int64) - first
    end = lengths[owner] - 1  # the streamline's last point number
    del owner
    keep = xp.ones(n, dtype=bool)
    limit = float(tolerance) ** 2
    axes = [xp.ascontiguousarray(points[:, k], dtype=xp.float32) for k in range(3)]  # x, y, z apart: 1-D gathers
    for level in range(1, passes + 1):
        h = 1 << (level - 1)
        base = local - (local & (2 * h - 1))
        right = xp.minimum(base + 2 * h, end)
        middle = base + h
        inside = (local > base) & (local < right)
        ia, ib = first + base, first + right
        dot = xp.zeros(n, dtype=xp.float32)
        squared = xp.zeros(n, dtype=xp.float32)
        offsets, alongs = [], []
        for axis in axes:
            a = axis[ia]
            along = axis[ib] - a
            offset = axis - a
            dot += offset * along
            squared += along * along
            offsets.append(offset)
            alongs.append(along)
        t = xp.clip(dot / xp.where(squared > 0, squared, xp.float32(1.0)), 0.0, 1.0)
        distance = xp.zeros(n, dtype=xp.float32)
        for offset, along in zip(offsets, alongs, strict=True):
            gap = offset - t * along
            distance += gap * gap
        far = distance > limit
        del ia, ib, dot, squared, offsets, alongs, t, distance
        # an interval is blocked by a point inside it that is too far, or kept and not its middle
        blocker = inside & (middle < end) & (far | (keep & (local != middle)))
        blocked = xp.zeros(n, dtype=bool)
        blocked[(first + middle)[flatnonzero(xp, blocker)]] = True
        drop = (local == middle) & (middle < end) & ~blocked
        keep &= ~drop
        del base, right, middle, inside, far, blocker, blocked, drop
    kept = flatnonzero(xp, keep)
    running = xp.zeros(n + 1, dtype=xp.int64)  # kept points before each point: read at the streamlines' ends
    running[1:] = xp.cumsum(keep, dtype=xp.int64)
    return kept, running[starts + lengths] - running[starts]
