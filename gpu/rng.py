"""Counter-based random streams: Philox4x32-10 (Salmon, Moraes, Dror & Shaw 2011, "Parallel
random numbers: as easy as 1, 2, 3", SC'11), identical to ``kernels/philox.cuh``.

A draw is a pure function of a 128-bit counter and a 64-bit key, so every voxel or streamline
owns its stream (the counter holds its index) and results do not depend on batch sizes, thread
counts or the engine. Ball & sticks' MCMC (:mod:`gpu.ballstick_mcmc`), the general model fits
(:mod:`gpu.models.optimize`), probabilistic tracking (:mod:`gpu.probabilistic`) and fODF
tracking (:mod:`gpu.fod_tracking`) draw from here.
"""

from __future__ import annotations

import numpy as np

PHILOX_M = (0xD2511F53, 0xCD9E8D57)
PHILOX_W = (0x9E3779B9, 0xBB67AE85)
_MASK32 = np.uint64(0xFFFFFFFF)


def philox4x32(counter, key, xp=np):
    """Philox4x32-10 of ``counter`` (4 arrays of uint32 values, broadcast) under ``key`` (2 uint32
    ints), on the array module ``xp``: four uint32 arrays."""
    c = [xp.asarray(x, dtype=xp.uint64) for x in counter]
    k0, k1 = np.uint64(key[0]), np.uint64(key[1])
    m0, m1 = np.uint64(PHILOX_M[0]), np.uint64(PHILOX_M[1])
    for r in range(10):
        if r:
            k0 = (k0 + np.uint64(PHILOX_W[0])) & _MASK32
            k1 = (k1 + np.uint64(PHILOX_W[1])) & _MASK32
        p0 = m0 * c[0]
        p1 = m1 * c[2]
        c = [(p1 >> np.uint64(32)) ^ c[1] ^ k0, p1 & _MASK32, (p0 >> np.uint64(32)) ^ c[3] ^ k1, p0 & _MASK32]
    return [x.astype(xp.uint32) for x in c]


def seed_key(seed: int) -> tuple[int, int]:
    """The Philox key of a 64-bit seed: its low and high words."""
    return seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF


def normal_and_log_uniform(voxels, draw: int, key: tuple[int, int], xp=np):
    """A standard normal (Box–Muller) and the log of a uniform per voxel, from counter
    (``draw``, 0, voxel index low, high): a Metropolis proposal and its acceptance test."""
    v = xp.asarray(voxels).astype(xp.uint64)
    r = philox4x32((np.uint64(draw), np.uint64(0), v & _MASK32, v >> np.uint64(32)), key, xp)
    u1, u2, u3 = ((x.astype(xp.float64) + 0.5) * 2.0**-32 for x in r[:3])
    return xp.sqrt(-2.0 * xp.log(u1)) * xp.cos(2.0 * np.pi * u2), xp.log(u3)
