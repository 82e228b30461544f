"""Go's math/rand/v2 PCG (128-bit LCG with DXSM output), bit-exact.

The reference engine draws LoRA A matrices and sampling randomness from this generator, so
the worker reproduces it: an adapter created here from a seed equals the reference engine's
adapter from the same seed, bit for bit. `uniform_block` is a vectorised (numpy) version
that computes many consecutive draws at once using LCG jump-ahead.
"""

from __future__ import annotations

import numpy as np

MASK64 = (1 << 64) - 1
MASK128 = (1 << 128) - 1
MUL = (2549297995355413924 << 64) | 4865540595714422341
INC = (6364136223846793005 << 64) | 1442695040888963407
CHEAP_MUL = 0xDA942042E4DD58B5
GOLDEN = 0x9E3779B97F4A7C15


def fnv64a(data: bytes) -> int:
    h = 14695981039346656037
    for b in data:
        h ^= b
        h = (h * 1099511628211) & MASK64
    return h


def _dxsm(hi: int, lo: int) -> int:
    hi ^= hi >> 32
    hi = (hi * CHEAP_MUL) & MASK64
    hi ^= hi >> 48
    hi = (hi * (lo | 1)) & MASK64
    return hi


class PCG:
    """rand.NewPCG(seed1, seed2) with rand.Rand's Uint64 and Float64."""

    def __init__(self, seed1: int, seed2: int):
        self.state = ((seed1 & MASK64) << 64) | (seed2 & MASK64)

    def uint64(self) -> int:
        self.state = (self.state * MUL + INC) & MASK128
        return _dxsm(self.state >> 64, self.state & MASK64)

    def float64(self) -> float:
        return float(self.uint64() & ((1 << 53) - 1)) / float(1 << 53)


def new_rng(seed: int) -> PCG:
    """nn.newRNG in the reference engine: NewPCG(seed, seed ^ 0x9e3779b97f4a7c15)."""
    seed &= MASK64
    return PCG(seed, seed ^ GOLDEN)


def _u(x: int) -> np.uint64:
    return np.uint64(x & MASK64)


def _mul128_const(hi: np.ndarray, lo: np.ndarray, m: int):
    """(hi, lo) * m mod 2**128 for uint64 arrays and a 128-bit constant."""
    mh, ml = _u(m >> 64), _u(m)
    m0, m1 = _u(m & 0xFFFFFFFF), _u((m >> 32) & 0xFFFFFFFF)
    s32 = np.uint64(32)
    low = np.uint64(0xFFFFFFFF)
    a0 = lo & low
    a1 = lo >> s32
    p00 = a0 * m0
    p01 = a0 * m1
    p10 = a1 * m0
    p11 = a1 * m1
    mid = (p00 >> s32) + (p01 & low) + (p10 & low)
    mulhi = p11 + (p01 >> s32) + (p10 >> s32) + (mid >> s32)
    new_lo = lo * ml
    new_hi = mulhi + hi * ml + lo * mh
    return new_hi, new_lo


def _add128_const(hi: np.ndarray, lo: np.ndarray, c: int):
    ch, cl = _u(c >> 64), _u(c)
    new_lo = lo + cl
    carry = (new_lo < lo).astype(np.uint64)
    return hi + ch + carry, new_lo


def float64_block(rng: PCG, n: int, lanes: int = 4096) -> np.ndarray:
    """The next n values of rng.float64(), vectorised; advances rng by n draws."""
    out = np.empty(n, dtype=np.float64)
    if n == 0:
        return out
    lanes = max(1, min(lanes, n))
    # states after 1..lanes steps, computed sequentially
    st = rng.state
    his = np.empty(lanes, dtype=np.uint64)
    los = np.empty(lanes, dtype=np.uint64)
    for i in range(lanes):
        st = (st * MUL + INC) & MASK128
        his[i] = st >> 64
        los[i] = st & MASK64
    # affine map for `lanes` steps: s -> s*mb + cb
    mb, cb = 1, 0
    for _ in range(lanes):
        mb, cb = (mb * MUL) & MASK128, (cb * MUL + INC) & MASK128
    s32, s48 = np.uint64(32), np.uint64(48)
    mask53 = np.uint64((1 << 53) - 1)
    done = 0
    last_hi, last_lo = his, los
    while done < n:
        k = min(lanes, n - done)
        h, l = his[:k], los[:k]
        x = h ^ (h >> s32)
        x = x * _u(CHEAP_MUL)
        x = x ^ (x >> s48)
        x = x * (l | np.uint64(1))
        out[done:done + k] = (x & mask53).astype(np.float64) / float(1 << 53)
        last_hi, last_lo = h, l
        done += k
        if done < n:
            his, los = _mul128_const(his, los, mb)
            his, los = _add128_const(his, los, cb)
    rng.state = (int(last_hi[-1]) << 64) | int(last_lo[-1])
    return out
