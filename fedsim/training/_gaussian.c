/* fedsim's Gaussian sampler, compiled once per machine by fedsim/training/native.py.
 *
 * Pair i of a draw from a SplitMix64 stream with seed s and odd gamma g (p = number of pairs,
 * std = the noise std):
 *   z  = mix64(s + (i + 1) * g)                 (the stream's output i)
 *   u1 = ((z >> 40) + 1) / 2^24                in (0, 1]
 *   u2 = ((z >> 16) & 0xFFFFFF) / 2^24         in [0, 1)
 *   out[i]     = std * sqrt(-2 ln u1) * cos(2 pi u2)
 *   out[p + i] = std * sqrt(-2 ln u1) * sin(2 pi u2)
 * except in the tail: when z >> 40 is 0 (chance 2^-24 a pair), u1 is refined with the 16 bits
 * below u2 (b = z & 0xFFFF) and the stream's output p + i (c, 64 bits, never used otherwise):
 *   u1 = (2^64 b + c + 1) / 2^104                in (0, 2^-24]
 * so the radius reaches sqrt(208 ln 2) ~ 12.01 instead of stopping at sqrt(48 ln 2) ~ 5.77.
 * That tail is computed in double precision by a scalar pass over the block's rare tail pairs.
 * gaussian.py holds the same definition in torch operations; tests compare the two.
 *
 * ln, cos and sin are Cephes' single-precision polynomials (Moshier, "Methods and Programs for
 * Mathematical Functions", 1989: logf, sinf, cosf) written branch-free so that the loop
 * vectorises (-O3 -ffast-math) with no vector maths library. The angle is reduced exactly
 * from u2 (8 u2 is exact in float32; its octant is an integer), where glibc's cosf of
 * 2 pi u2 first rounds the angle: against float64 over 20 M pairs the largest error is
 * 9.5e-7 (1.7e-6 for the libmvec cos/log this replaced), and a draw of 101,765 pairs takes
 * 280 us instead of 490 on one AVX2 core (AMD EPYC).
 */
/* On x86-64 with AVX-512, GCC vectorises 256 bits at a time unless asked (-mprefer-vector-width
 * defaults to 256 for fear of lowering the clock): here the loops are all arithmetic, and 512
 * bits measured 30% faster (101,765 pairs: 240-350 us -> 160-250 us, Intel Xeon with
 * AVX-512, one thread, interleaved runs); MKL's GEMMs around the draw already run 512-bit
 * code. Other compilers and CPUs ignore this (GCC before 8 does not know the option). */
#if defined(__GNUC__) && __GNUC__ >= 8 && !defined(__clang__) && defined(__x86_64__)
#pragma GCC target("prefer-vector-width=512")
#endif

#include <stdint.h>
#include <string.h>
#include <math.h>

#define BLOCK 1024

static inline uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

/* Returns how many of the n pairs are in the tail (hi == 0). */
static int stream_bits(uint32_t *restrict hi, uint32_t *restrict lo, uint64_t seed,
                       uint64_t gamma, int64_t start, int n) {
    /* The counter's multiple of gamma as a running sum: one 64-bit product less a value
       (AVX2 has no 64-bit multiply; measured 154 -> 93 us for 101,765 pairs). */
    uint64_t state = seed + (uint64_t)(start + 1) * gamma;
    int tail = 0;
    for (int j = 0; j < n; j++, state += gamma) {
        uint64_t z = mix64(state);
        hi[j] = (uint32_t)(z >> 40);
        lo[j] = (uint32_t)(z >> 16) & 0xFFFFFFu;
        tail += hi[j] == 0;
    }
    return tail;
}

/* ln(x) for x in [2^-24, 1]: Cephes' logf (x = m 2^e, m in [sqrt(1/2), sqrt(2))). */
static inline float log_unit(float x) {
    uint32_t bits;
    memcpy(&bits, &x, 4);
    int e = (int)(bits >> 23) - 126;                 /* x = m 2^e, m in [0.5, 1) */
    uint32_t mbits = (bits & 0x7FFFFFu) | 0x3F000000u;
    float m;
    memcpy(&m, &mbits, 4);
    int small = m < 0.70710678118654752440f;
    e = small ? e - 1 : e;
    float f = small ? m + m - 1.0f : m - 1.0f;
    float z = f * f;
    float y = 7.0376836292E-2f;
    y = y * f - 1.1514610310E-1f;
    y = y * f + 1.1676998740E-1f;
    y = y * f - 1.2420140846E-1f;
    y = y * f + 1.4249322787E-1f;
    y = y * f - 1.6668057665E-1f;
    y = y * f + 2.0000714765E-1f;
    y = y * f - 2.4999993993E-1f;
    y = y * f + 3.3333331174E-1f;
    y = y * f * z;
    float fe = (float)e;
    y += -2.12194440e-4f * fe;
    y += -0.5f * z;
    return f + y + 0.693359375f * fe;
}

/* cos and sin of 2 pi u2 for u2 = lo / 2^24. */
static inline void unit_angle(uint32_t lo, float *restrict cos_out, float *restrict sin_out) {
    /* 2 pi u2 = (pi / 4) (j8 + f): octant j8 rounded to even, f in [-1, 1) exactly. */
    float v = (float)(int32_t)lo * 0x1p-21f;       /* 8 u2, exact */
    int oct = ((int)v + 1) & ~1;
    float x = (v - (float)oct) * 0.78539816339744830962f;
    float z = x * x;
    float s = x + x * z * (-1.6666654611E-1f + z * (8.3321608736E-3f + z * -1.9515295891E-4f));
    float c = 1.0f - 0.5f * z + z * z * (4.166664568298827E-2f + z * (-1.388731625493765E-3f + z * 2.443315711809948E-5f));
    int q = (oct >> 1) & 3;
    float cs = (q & 1) ? s : c, sn = (q & 1) ? c : s;
    *cos_out = (q == 1 || q == 2) ? -cs : cs;
    *sin_out = (q >= 2) ? -sn : sn;
}

static void box_muller(float *restrict a, float *restrict b, const uint32_t *restrict hi,
                       const uint32_t *restrict lo, int n, float std) {
    for (int j = 0; j < n; j++) {
        float u1 = ((float)(int32_t)hi[j] + 1.0f) * 0x1p-24f;
        float r = std * sqrtf(-2.0f * log_unit(u1));
        float cs, sn;
        unit_angle(lo[j], &cs, &sn);
        a[j] = r * cs;
        b[j] = r * sn;
    }
}

/* The tail pairs of a block (hi == 0), written again with u1 refined to 2^-104 (see the top). */
static void refine_tail(float *restrict a, float *restrict b, const uint32_t *restrict hi,
                        const uint32_t *restrict lo, uint64_t seed, uint64_t gamma,
                        int64_t pairs, int64_t start, int n, float std) {
    for (int j = 0; j < n; j++) {
        if (hi[j] != 0) continue;
        uint64_t i = (uint64_t)(start + j);
        uint64_t z = mix64(seed + (i + 1) * gamma);
        uint64_t c = mix64(seed + ((uint64_t)pairs + i + 1) * gamma);
        double u1 = ldexp((double)(z & 0xFFFFu), -40) + ldexp((double)c + 1.0, -104);
        float r = (float)((double)std * sqrt(-2.0 * log(u1)));
        float cs, sn;
        unit_angle(lo[j], &cs, &sn);
        a[j] = r * cs;
        b[j] = r * sn;
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
        int tail = stream_bits(hi, lo, seed, gamma, start, n);
        box_muller(out + start, out + pairs + start, hi, lo, n, std);
        if (tail)
            refine_tail(out + start, out + pairs + start, hi, lo, seed, gamma, pairs, start, n, std);
    }
}
