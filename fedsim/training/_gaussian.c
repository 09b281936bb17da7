/* fedsim's Gaussian sampler, compiled once per machine by fedsim/training/gaussian.py.
 *
 * Pair i of a draw from a SplitMix64 stream with seed s and odd gamma g (p = number of pairs,
 * std = the noise std):
 *   z  = mix64(s + (i + 1) * g)                 (the stream's output i)
 *   u1 = ((z >> 40) + 1) / 2^24                in (0, 1]
 *   u2 = ((z >> 16) & 0xFFFFFF) / 2^24         in [0, 1)
 *   out[i]     = std * sqrt(-2 ln u1) * cos(2 pi u2)
 *   out[p + i] = std * sqrt(-2 ln u1) * sin(2 pi u2)     (as cos(2 pi u2 - pi/2))
 * gaussian.py holds the same definition in torch operations; tests compare the two.
 *
 * Compiled with -ffast-math so that the cos/log loop vectorises through glibc's libmvec; the
 * library is linked without it (no crtfastmath: the process's denormal mode is left alone).
 * The sine is a shifted cosine because sin and cos of one argument fuse into a scalar sincosf.
 */
#include <stdint.h>
#include <math.h>

#define BLOCK 1024

static inline uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static void stream_bits(uint32_t *restrict hi, uint32_t *restrict lo, uint64_t seed,
                        uint64_t gamma, int64_t start, int n) {
    for (int j = 0; j < n; j++) {
        uint64_t z = mix64(seed + (uint64_t)(start + j + 1) * gamma);
        hi[j] = (uint32_t)(z >> 40);
        lo[j] = (uint32_t)(z >> 16) & 0xFFFFFFu;
    }
}

static void box_muller(float *restrict a, float *restrict b, const uint32_t *restrict hi,
                       const uint32_t *restrict lo, int n, float std) {
    for (int j = 0; j < n; j++) {
        float u1 = ((float)(int32_t)hi[j] + 1.0f) * 0x1p-24f;
        float u2 = (float)(int32_t)lo[j] * 0x1p-24f;
        float r = std * sqrtf(-2.0f * logf(u1));
        float t = 6.28318530717958647692f * u2;
        a[j] = r * cosf(t);
        b[j] = r * cosf(t - 1.57079632679489661923f);
    }
}

/* Fill out[0 .. 2 * pairs) as above, on up to `threads` OpenMP threads. */
void fedsim_gaussian_pairs(float *out, int64_t pairs, uint64_t seed, uint64_t gamma, float std,
                           int threads) {
    int64_t blocks = (pairs + BLOCK - 1) / BLOCK;
    #pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && blocks > 8)
    for (int64_t k = 0; k < blocks; k++) {
        uint32_t hi[BLOCK], lo[BLOCK];
        int64_t start = k * BLOCK;
        int n = (int)(pairs - start < BLOCK ? pairs - start : BLOCK);
        stream_bits(hi, lo, seed, gamma, start, n);
        box_muller(out + start, out + pairs + start, hi, lo, n, std);
    }
}
