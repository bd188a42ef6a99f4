"""Tests for pyspec/rules/rng.py: known answers (WGSL parity), scalar/vector identity, statistics."""

from __future__ import annotations

import math
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from pyspec.rules import rng

GENERATOR = Path(__file__).resolve().parent.parent / "scripts" / "rng_known_answers.c"

# Known answers, as printed by scripts/rng_known_answers.c (a standalone C copy of the hash in
# uint32_t arithmetic; test_the_table_is_what_the_c_generator_prints reruns it) and checked
# against _independent_hash below as well. Any change to the hash breaks parity with
# shaders/rng.wgsl and must fail here first.
# Key: (seed, position, stream, index).
KNOWN_HASHES = [
    ((0, 0, 0, 0), 0x0EAA7511),
    ((1, 0, 0, 0), 0x62181B8D),
    ((0, 1, 0, 0), 0x7D2B5EA8),
    ((0, 0, 1, 0), 0xF3AA8044),
    ((0, 0, 0, 1), 0x6078A4C7),
    ((2**64 - 1, 2**32 - 1, 2**32 - 1, 2**32 - 1), 0x8CBF1C0F),
    ((0x0123456789ABCDEF, 17, 1, 0), 0xD3E0F3B6),
    ((42, 1000, 5, 49151), 0xF8A224C7),
    ((2**32, 0, 0, 0), 0x1FDB3517),
    ((7, 3, 5, 2), 0x399F59D4),
    ((0xDEADBEEFCAFEF00D, 123456, 4, 0), 0xF8150FAF),
]


def test_the_table_is_what_the_c_generator_prints(tmp_path):
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler to rebuild the known answers (the table is still checked)")
    exe = tmp_path / "rng_kat"
    subprocess.run([compiler, "-O2", "-o", str(exe), str(GENERATOR)], check=True)
    lines = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    printed = [((int(a, 16), int(b, 16), int(c, 16), int(d, 16)), int(h, 16))
               for a, b, c, d, h in (line.split() for line in lines.splitlines())]
    assert printed == KNOWN_HASHES


def _independent_hash(seed: int, position: int, stream: int, index: int) -> int:
    """The hash from its definition (DESIGN section 4, the WGSL listed in rng.py's comment),
    written apart from rng.py in plain Python ints: every u32 product masked explicitly, as WGSL's
    u32 multiply wraps. The 64-bit seed enters as two words, low then high."""
    mask = 0xFFFFFFFF

    def lowbias32(x):  # C. Wellons' hash-prospector "lowbias32"
        x ^= x >> 16
        x = (x * 0x7FEB352D) & mask
        x ^= x >> 15
        x = (x * 0x846CA68B) & mask
        x ^= x >> 16
        return x

    h = 0x9E3779B9
    for word in (seed & mask, (seed >> 32) & mask, position, stream, index):
        h = lowbias32(h ^ word)
    return h


def _keys() -> list[tuple[int, int, int, int]]:
    """A few hundred random keys (seeds over all 64 bits, the rest over all of u32), then every
    combination of the edge values 0, 1, 2^32 - 1 (and 2^32, 2^64 - 1 for the seed)."""
    gen = np.random.default_rng(2024)
    u32_edges = (0, 1, 2**32 - 1)
    keys = [(int(gen.integers(0, 2**64, dtype=np.uint64)),
             *(int(x) for x in gen.integers(0, 2**32, 3))) for _ in range(300)]
    keys += [(int(gen.integers(0, 2**32)), *(int(x) for x in gen.integers(0, 2**32, 3)))
             for _ in range(50)]  # seeds < 2^32: high word 0
    keys += [(s, p, st, i) for s in (0, 1, 2**32 - 1, 2**32, 2**64 - 1)
             for p in u32_edges for st in u32_edges for i in u32_edges]
    return keys


def test_scalar_functions_match_an_independent_implementation():
    for key in _keys():
        expected = _independent_hash(*key)
        assert rng.hash_u32(*key) == expected, key
        assert rng.uniform(*key) == (expected >> 8) / 2**24, key


def test_vectorised_functions_match_an_independent_implementation():
    keys = _keys()
    by_seed: dict[int, list[tuple[int, int, int]]] = {}
    for seed, *rest in keys:
        by_seed.setdefault(seed, []).append(tuple(rest))
    # Scalar position and stream (absorbed before the array words), an index array.
    for seed, position, stream, index in keys:
        indices = np.array([index, 0, 2**32 - 1], dtype=np.uint64)  # (3,)
        expected = [_independent_hash(seed, position, stream, int(i)) for i in indices]
        assert rng.hash_u32_array(seed, position, stream, indices).tolist() == expected
        assert rng.uniforms(seed, position, stream, indices).tolist() == \
            [(h >> 8) / 2**24 for h in expected]
    # Position, stream and index all arrays: every word goes through the numpy mix.
    for seed, rest in by_seed.items():
        p, st, i = (np.array(col, dtype=np.int64) for col in zip(*rest))  # each (n,)
        expected = [_independent_hash(seed, *r) for r in rest]
        assert rng.hash_u32_array(seed, p, st, i).tolist() == expected, seed
        assert rng.uniforms(seed, p, st, i).tolist() == [(h >> 8) / 2**24 for h in expected]


@pytest.mark.parametrize("key, expected", KNOWN_HASHES)
def test_known_hashes(key, expected):
    assert _independent_hash(*key) == expected   # the C generator and the Python copy agree
    assert rng.hash_u32(*key) == expected
    assert int(rng.hash_u32_array(key[0], key[1], key[2], np.array([key[3]]))[0]) == expected


def test_known_uniform_and_gumbel():
    # (0xF8A224C7 >> 8) * 2^-24, exact in float64 and float32 alike.
    assert rng.uniform(42, 1000, 5, 49151) == 0.97122406959533691
    assert rng.uniform(42, 1000, 5, 49151) == (0xF8A224C7 >> 8) / 2**24
    g = rng.gumbel(7, 3, 4)  # (4,)
    u = np.array([rng.uniform(7, 3, rng.STREAM_GUMBEL, i) for i in range(4)])
    np.testing.assert_array_equal(g, -np.log(-np.log(u + 2.0**-25)))
    rows = rng.gumbel(7, np.array([5, 3]), 4)  # (2, 4): positions given as an array
    np.testing.assert_array_equal(rows[1], g)
    np.testing.assert_array_equal(rows[0], rng.gumbel(7, 5, 4))


def test_stream_constants_are_distinct():
    streams = [rng.STREAM_ACCEPT, rng.STREAM_RESIDUAL, rng.STREAM_BONUS, rng.STREAM_DRAFT,
               rng.STREAM_GUMBEL]
    assert len(set(streams)) == len(streams)


def test_scalar_and_vectorised_are_bit_identical():
    gen = np.random.default_rng(0)
    seeds = [0, 1, 2**32 - 1, 2**32, 2**63, 2**64 - 1] + [int(s) for s in
                                                          gen.integers(0, 2**63, 4)]
    for seed in seeds:
        position = int(gen.integers(0, 2**32))
        stream = int(gen.integers(0, 8))
        indices = np.concatenate([gen.integers(0, 2**32, 200), [0, 1, 2**32 - 1]])  # (203,)
        vector = rng.uniforms(seed, position, stream, indices)  # (203,)
        hashes = rng.hash_u32_array(seed, position, stream, indices)
        for i, index in enumerate(indices):
            assert int(hashes[i]) == rng.hash_u32(seed, position, stream, int(index))
            assert vector[i] == rng.uniform(seed, position, stream, int(index))


def test_vectorised_broadcasts_over_positions():
    positions = np.arange(50)[:, None]  # (50, 1)
    indices = np.arange(3)[None, :]  # (1, 3)
    grid = rng.uniforms(9, positions, rng.STREAM_DRAFT, indices)  # (50, 3)
    assert grid.shape == (50, 3)
    for p in (0, 17, 49):
        for i in range(3):
            assert grid[p, i] == rng.uniform(9, p, rng.STREAM_DRAFT, i)


def test_range_of_uniform_and_gumbel():
    u = rng.uniforms(5, 0, rng.STREAM_ACCEPT, np.arange(100_000))  # (100000,)
    assert u.min() >= 0.0 and u.max() <= 1.0 - 2.0**-24
    assert np.all(u * 2**24 == np.floor(u * 2**24))  # 24-bit grid: exact in float32 on the GPU
    g = rng.gumbel(5, 0, 100_000)  # (100000,)
    assert np.isfinite(g).all()
    assert g.min() >= -math.log(-math.log(2.0**-25))  # u' >= 2^-25
    assert g.max() <= -math.log(-math.log(1 - 2.0**-25))  # u' <= 1 - 2^-25


def test_keys_out_of_range_are_refused():
    with pytest.raises(rng.RngKeyError, match="seed"):
        rng.uniform(2**64, 0, 0)
    with pytest.raises(rng.RngKeyError, match="seed"):
        rng.uniform(-1, 0, 0)
    with pytest.raises(rng.RngKeyError, match="position"):
        rng.uniform(0, 2**32, 0)
    with pytest.raises(rng.RngKeyError, match="indices"):
        rng.uniforms(0, 0, 0, np.array([-1, 2]))
    with pytest.raises(rng.RngKeyError, match="integers"):
        rng.uniforms(0, 0, 0, np.array([0.5]))


# Chi-square over 100 equal bins of 100,000 draws: 99 degrees of freedom, mean 99, sd sqrt(198)
# = 14.07. Bound: within 5 sd of the mean, [28.6, 169.4] (a true uniform fails with p < 1e-5;
# the lower side catches a generator that is too even, e.g. a counter).
CHI2_LOW, CHI2_HIGH = 99 - 5 * math.sqrt(198), 99 + 5 * math.sqrt(198)


def _chi_square(u: np.ndarray, bins: int = 100) -> float:  # u: (n,)
    counts = np.bincount((u * bins).astype(np.int64), minlength=bins)
    expected = len(u) / bins
    return float(((counts - expected) ** 2 / expected).sum())


UNIFORM_SOURCES = {
    "indices": lambda: rng.uniforms(123, 77, rng.STREAM_GUMBEL, np.arange(100_000)),
    "positions": lambda: rng.uniforms(123, np.arange(100_000), rng.STREAM_ACCEPT, 0),
    # Consecutive seeds: the key part a user is most likely to count up.
    "seeds": lambda: np.array([rng.uniform(s, 0, rng.STREAM_BONUS) for s in range(100_000)]),
}


@pytest.mark.parametrize("counted_over", list(UNIFORM_SOURCES))
def test_uniformity_chi_square(counted_over):
    u = UNIFORM_SOURCES[counted_over]()  # (100000,)
    assert len(u) == 100_000
    assert CHI2_LOW < _chi_square(u) < CHI2_HIGH


def test_streams_and_positions_give_different_sequences():
    n = 100_000
    indices = np.arange(n)
    base = rng.uniforms(1, 10, rng.STREAM_GUMBEL, indices)  # (n,)
    others = {
        "stream": rng.uniforms(1, 10, rng.STREAM_ACCEPT, indices),
        "position": rng.uniforms(1, 11, rng.STREAM_GUMBEL, indices),
        "seed": rng.uniforms(2, 10, rng.STREAM_GUMBEL, indices),
        "seed high word": rng.uniforms(1 + 2**32, 10, rng.STREAM_GUMBEL, indices),
        "index shift": rng.uniforms(1, 10, rng.STREAM_GUMBEL, indices + 1),
    }
    # Pearson correlation of independent uniforms has sd 1/sqrt(n) = 0.0032; bound 5 sd.
    bound = 5 / math.sqrt(n)
    for name, other in others.items():
        assert not np.array_equal(base, other), name
        # Equal values would be 2^-24 coincidences: expect about n * 2^-24 = 0.006 of them.
        assert int((base == other).sum()) <= 3, name
        assert abs(np.corrcoef(base, other)[0, 1]) < bound, name
    # The uniforms of one key component counted up are not correlated with their neighbours.
    along_positions = rng.uniforms(1, np.arange(n + 1), rng.STREAM_ACCEPT, 0)  # (n+1,)
    assert abs(np.corrcoef(along_positions[:-1], along_positions[1:])[0, 1]) < bound


def test_gumbel_has_the_standard_moments():
    # Standard Gumbel: mean = Euler-Mascheroni 0.5772, variance pi^2 / 6 = 1.645.
    g = rng.gumbel(99, 4, 200_000)  # (200000,)
    n = len(g)
    assert abs(g.mean() - 0.5772156649) < 5 * math.sqrt(math.pi**2 / 6 / n)
    # The sample variance has sd sqrt((excess kurtosis 2.4 + 2) var^2 / n) = 0.0077: 0.05 is 6.5 sd.
    assert abs(g.var() - math.pi**2 / 6) < 0.05
