/* The server's mix of a float32 update into its float64 direction, in one pass, compiled by
 * fedsim/training/native.py (fedsim/aggregation/scaled_add.py):
 *
 *   fedsim_add_scaled_f64(d, u, s, n):  d[i] += (double)u[i] * s
 *
 * numpy makes it in three passes (widen into a float64 scratch, multiply, add). The result
 * must be numpy's to the bit: the product is rounded, then the sum (no fused multiply-add:
 * native.recipes(fast_math=False) builds it without -ffast-math and with -ffp-contract=off);
 * the loader checks this on probes. */
#include <stdint.h>
#include <string.h>

/* An update decoded from a frame is a view into it at any byte offset: its values are read
 * with memcpy (an unaligned load, defined behaviour; the compiler emits plain vector loads). */
void fedsim_add_scaled_f64(double *restrict d, const void *restrict u, double s, int64_t n) {
    const unsigned char *bytes = (const unsigned char *)u;
    for (int64_t i = 0; i < n; i++) {
        float value;
        memcpy(&value, bytes + 4 * i, sizeof value);
        double product = (double)value * s;
        d[i] = d[i] + product;
    }
}
