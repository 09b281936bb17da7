/* The sum of squares of a float32 vector, accumulated in float64: the integrity norm of an
 * update (fedsim/protocol/codec.py, vector_norm), compiled by fedsim/training/native.py.
 *
 * numpy has no float32 -> float64 dot without converting the vector first: the codec copied
 * each update into a float64 buffer and summed that (two passes, 0.1 ms for 10^5 values),
 * for every update a client seals and a server decodes. Here one pass reads the floats and
 * widens them in registers. Sixteen partial sums in a fixed layout (then added in order) fix
 * the order of the additions whatever the compiler vectorises, so a machine's value is
 * reproducible. NaN and inf propagate through the sums (no comparisons are made here), so the
 * result is finite exactly when every value is: codec.py checks that, and checks the loaded
 * kernel against numpy on finite, NaN and inf probes before it uses it.
 */
#include <stdint.h>
#include <string.h>

#define LANES 16

/* A decoded update is a view into its frame, at any byte offset: values are read with memcpy
 * (an unaligned load, defined behaviour; the compiler emits plain vector loads). */
static inline double widened(const unsigned char *at) {
    float value;
    memcpy(&value, at, sizeof value);
    return (double)value;
}

double fedsim_sum_squares(const void *data, int64_t n) {
    const unsigned char *bytes = (const unsigned char *)data;
    double acc[LANES] = {0.0};
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES) {
        for (int k = 0; k < LANES; k++) {
            double v = widened(bytes + 4 * (i + k));
            acc[k] += v * v;
        }
    }
    double total = 0.0;
    for (; i < n; i++) {
        double v = widened(bytes + 4 * i);
        total += v * v;
    }
    for (int k = 0; k < LANES; k++)
        total += acc[k];
    return total;
}
