/* Known answers for pyspec's counter-based RNG (pyspec/rng.py, shaders/rng.wgsl), from a
 * standalone C copy of the hash in uint32_t arithmetic: an implementation that shares no code
 * with either. tests/test_rng.py compiles and runs this file and compares every line with its
 * KNOWN_HASHES table and with pyspec.rng.
 *
 *   cc -O2 -o rng_kat scripts/rng_known_answers.c && ./rng_kat
 *
 * Output: one line per key, "seed position stream index hash", all in hex.
 */
#include <stdint.h>
#include <stdio.h>

static uint32_t mix32(uint32_t x) {
    x ^= x >> 16; x *= 0x7feb352du;
    x ^= x >> 15; x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}

static uint32_t hash_u32(uint64_t seed, uint32_t position, uint32_t stream, uint32_t index) {
    uint32_t h = 0x9e3779b9u;
    h = mix32(h ^ (uint32_t)seed);
    h = mix32(h ^ (uint32_t)(seed >> 32));
    h = mix32(h ^ position);
    h = mix32(h ^ stream);
    h = mix32(h ^ index);
    return h;
}

int main(void) {
    static const struct { uint64_t seed; uint32_t position, stream, index; } keys[] = {
        {0, 0, 0, 0}, {1, 0, 0, 0}, {0, 1, 0, 0}, {0, 0, 1, 0}, {0, 0, 0, 1},
        {UINT64_MAX, UINT32_MAX, UINT32_MAX, UINT32_MAX},
        {0x0123456789ABCDEFull, 17, 1, 0}, {42, 1000, 5, 49151},
        {0x100000000ull, 0, 0, 0}, {7, 3, 5, 2}, {0xDEADBEEFCAFEF00Dull, 123456, 4, 0},
    };
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        printf("%llx %x %x %x %08x\n", (unsigned long long)keys[i].seed, keys[i].position,
               keys[i].stream, keys[i].index,
               hash_u32(keys[i].seed, keys[i].position, keys[i].stream, keys[i].index));
    return 0;
}
