/* The server's mix of a float32 update into its float64 direction, in one pass, compiled by
 * fedsim/training/native.py (fedsim/aggregation/scaled_add.py):
 *
 *   fedsim_add_scaled_f64(d, u, s, n):  d[i] += (double)u[i] * s
 *
 * numpy makes it in three passes (widen into a float64 scratch, multiply, add). The result
 * must be numpy's to the bit: the product is rounded, then the sum (no fused multiply-add:
 * fp-contract is off below, and -ffast-math has no reduction here to reorder); the loader
 * checks this on probes. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("fp-contract=off")
#endif
#if defined(__clang__)
#pragma clang fp contract(off)
#endif

#include <stdint.h>

void fedsim_add_scaled_f64(double *restrict d, const float *restrict u, double s, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        double product = (double)u[i] * s;
        d[i] = d[i] + product;
    }
}
