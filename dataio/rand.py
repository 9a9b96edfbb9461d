"""The package's one source of randomness: splitmix64, a counter-based 64-bit hash.

Our own arithmetic rather than numpy's Generator streams, whose output numpy does not promise to
keep across versions: a saved plan state must replay bit for bit after an upgrade, and a
sample's augmentation must depend only on (seed, epoch, sample id), whichever worker or machine
decodes it. Keys hash tuples of ints, permutations argsort hashed indices, per-sample seeds are
keys of (seed, epoch, sample id), and SampleRandom draws uniforms from one seed.
"""

from __future__ import annotations

import numpy as np

MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_MUL1 = 0xBF58476D1CE4E5B9
_MUL2 = 0x94D049BB133111EB


def mix64(x: int) -> int:
    """splitmix64's output function on a Python int, modulo 2**64: a bijective mix of x + golden ratio."""
    x = (x + _GOLDEN) & MASK64
    x = ((x ^ (x >> 30)) * _MUL1) & MASK64
    x = ((x ^ (x >> 27)) * _MUL2) & MASK64
    return x ^ (x >> 31)


def key(*parts: int) -> int:
    """A 64-bit key hashing the parts in order; each part must lie in [0, 2**64)."""
    h = 0
    for part in parts:
        if not 0 <= part <= MASK64:
            raise ValueError(f"key part {part} outside [0, 2**64)")
        h = mix64(h ^ part)
    return h


def mix_array(x: np.ndarray) -> np.ndarray:
    """mix64 over a uint64 array (numpy's uint64 arithmetic wraps modulo 2**64, as splitmix64 wants)."""
    x = x + np.uint64(_GOLDEN)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(_MUL1)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(_MUL2)
    return x ^ (x >> np.uint64(31))


def permutation(k: int, n: int) -> np.ndarray:
    """A permutation of range(n), (n,) int64, fixed by the key: argsort of hashed indices."""
    # Hashing twice (index, then xor key) keeps keys that differ by one from giving shifted orders.
    hashed = mix_array(mix_array(np.arange(n, dtype=np.uint64)) ^ np.uint64(k))
    return np.argsort(hashed, kind="stable").astype(np.int64, copy=False)


def sample_seed(seed: int, epoch: int, sample_id: int) -> int:
    """The 64-bit augmentation seed of one sample in one epoch: key(seed, epoch, id), each taken mod 2**64."""
    return key(int(seed) & MASK64, int(epoch) & MASK64, int(sample_id) & MASK64)


class SampleRandom:
    """A tiny splitmix64 stream of uniforms in [0, 1), seeded per sample."""

    __slots__ = ("_state",)

    def __init__(self, seed: int) -> None:
        self._state = int(seed) & MASK64

    def uniform(self, low: float = 0.0, high: float = 1.0) -> float:
        self._state = (self._state + _GOLDEN) & MASK64
        # splitmix64 already adds the constant; mixing the advanced state gives a fresh output.
        unit = (mix64(self._state) >> 11) * (1.0 / (1 << 53))
        return low + (high - low) * unit

    def randint(self, low: int, high: int) -> int:
        """Uniform integer in [low, high)."""
        return low + min(int(self.uniform() * (high - low)), high - low - 1)
