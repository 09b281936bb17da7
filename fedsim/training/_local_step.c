/* A client's local step with its own update, in one pass, compiled by
 * fedsim/training/native.py (fedsim/training/local_step.py):
 *
 *   fedsim_local_step_f32(out, w, u, s, n):  out[i] = w[i] + u[i] * s   (float32)
 *
 * numpy makes it in two passes and a fresh vector (u * s, then the sum). The result must be
 * numpy's to the bit: the float32 product is rounded, then the float32 sum (no fused
 * multiply-add: native.recipes(fast_math=False) builds it without -ffast-math and with
 * -ffp-contract=off); the loader checks this on probes. out may be w itself (in place). */
#include <stdint.h>
#include <string.h>

/* A received model is a view into its message at any byte offset: w and u are read with
 * memcpy (an unaligned load, defined behaviour; the compiler emits plain vector loads). */
void fedsim_local_step_f32(float *out, const void *w, const void *u, float s, int64_t n) {
    const unsigned char *wb = (const unsigned char *)w, *ub = (const unsigned char *)u;
    for (int64_t i = 0; i < n; i++) {
        float wi, ui;
        memcpy(&wi, wb + 4 * i, sizeof wi);
        memcpy(&ui, ub + 4 * i, sizeof ui);
        float product = ui * s;
        out[i] = wi + product;
    }
}
