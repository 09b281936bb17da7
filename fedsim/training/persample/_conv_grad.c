/* Per-example weight gradients of a 2-d convolution, computed directly (no patches).
 *
 * For example b, input channel c, kernel row ky, column kx and output channel o:
 *
 *   out[b, c, ky, kx, o] = sum over (oy, ox) of g[b, o, oy, ox] * x[b, c, oy*sh + ky*dh, ox*sw + kx*dw]
 *
 * with x the zero-padded input (B, C, Hp, Wp) and g the output gradient (B, O, OH, OW), both
 * contiguous float32; the rows are kernel-major, (C, kh, kw, O), and O is a multiple of 8.
 * Each example's output gradient is first transposed to (OH*OW, O) in a per-thread buffer;
 * then tiles of up to 12 eight-wide accumulators (OB blocks of 8 output channels x T kernel
 * weights (c, ky, kx)) run over the output positions: per position OB vector loads of g, T
 * broadcasts of x and OB*T fused multiply-adds, so the arithmetic, not the loads, sets the
 * pace. Every example's sums run in one fixed order on one thread: the values do not depend
 * on the number of threads.
 *
 * Written with GCC's vector extensions: -march=native turns them into AVX2 + FMA where the
 * CPU has them; fedsim_conv_grad_vectorised() says whether it did (the Python side uses this
 * kernel only then, as it was measured only there).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef float v8 __attribute__((vector_size(32)));

static inline v8 load8(const float *p) {
    v8 v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void store8(float *p, v8 v) { memcpy(p, &v, sizeof v); }

struct geometry {
    int64_t out_h, out_w, channels_out, row_step, col_step;
};

/* One tile: OB blocks of 8 output channels (from ob0) x T kernel weights (offsets off[0..T)).
 * At most 12 accumulators: with the OB vectors of g and one broadcast, 15 of AVX2's 16 registers
 * for OB = 1 and 2; the 4 x 3 tile needs 17 and spills one. */
#define DEFINE_TILE(OB, T)                                                                   \
    static void tile_##OB##_##T(const float *restrict x, const float *restrict gt,           \
                                const int64_t *restrict offsets, float *restrict out,        \
                                const struct geometry *geo, int64_t ob0) {                  \
        v8 acc[OB][T];                                                                       \
        int64_t off[T];                                                                      \
        _Pragma("GCC unroll 16") for (int t = 0; t < T; t++) off[t] = offsets[t];            \
        _Pragma("GCC unroll 16") for (int j = 0; j < OB; j++)                                \
            _Pragma("GCC unroll 16") for (int t = 0; t < T; t++) acc[j][t] = (v8){0};        \
        const float *gs = gt + ob0 * 8;                                                      \
        for (int64_t oy = 0; oy < geo->out_h; oy++) {                                        \
            const float *xs = x + oy * geo->row_step;                                        \
            for (int64_t ox = 0; ox < geo->out_w; ox++, xs += geo->col_step,                 \
                         gs += geo->channels_out) {                                          \
                v8 gv[OB];                                                                   \
                _Pragma("GCC unroll 16") for (int j = 0; j < OB; j++) gv[j] = load8(gs + 8 * j); \
                _Pragma("GCC unroll 16") for (int t = 0; t < T; t++) {                       \
                    const float xv = xs[off[t]];                                             \
                    _Pragma("GCC unroll 16") for (int j = 0; j < OB; j++) acc[j][t] += gv[j] * xv; \
                }                                                                            \
            }                                                                                \
        }                                                                                    \
        _Pragma("GCC unroll 16") for (int t = 0; t < T; t++)                                 \
            _Pragma("GCC unroll 16") for (int j = 0; j < OB; j++)                            \
                store8(out + t * geo->channels_out + ob0 * 8 + 8 * j, acc[j][t]);            \
    }

DEFINE_TILE(4, 1) DEFINE_TILE(4, 2) DEFINE_TILE(4, 3)
DEFINE_TILE(2, 1) DEFINE_TILE(2, 2) DEFINE_TILE(2, 3) DEFINE_TILE(2, 4)
DEFINE_TILE(2, 5) DEFINE_TILE(2, 6)
DEFINE_TILE(1, 1) DEFINE_TILE(1, 2) DEFINE_TILE(1, 3) DEFINE_TILE(1, 4)
DEFINE_TILE(1, 5) DEFINE_TILE(1, 6) DEFINE_TILE(1, 7) DEFINE_TILE(1, 8)
DEFINE_TILE(1, 9) DEFINE_TILE(1, 10) DEFINE_TILE(1, 11) DEFINE_TILE(1, 12)

typedef void (*tile_fn)(const float *, const float *, const int64_t *, float *,
                        const struct geometry *, int64_t);

#define MOST4 3
#define MOST2 6
#define MOST1 12
static const tile_fn TILES4[] = {0, tile_4_1, tile_4_2, tile_4_3};
static const tile_fn TILES2[] = {0, tile_2_1, tile_2_2, tile_2_3, tile_2_4, tile_2_5, tile_2_6};
static const tile_fn TILES1[] = {0, tile_1_1, tile_1_2, tile_1_3, tile_1_4, tile_1_5, tile_1_6,
                                 tile_1_7, tile_1_8, tile_1_9, tile_1_10, tile_1_11, tile_1_12};

int fedsim_conv_grad_vectorised(void) {
#if defined(__AVX2__) && defined(__FMA__)
    return 1;
#else
    return 0;
#endif
}

/* Returns 0, or -1 when a buffer could not be allocated (out is then incomplete). */
int fedsim_conv_grad_per_example(const float *x, const float *g, float *out, int64_t batch,
                                 int64_t channels, int64_t height, int64_t width,
                                 int64_t channels_out, int64_t out_h, int64_t out_w,
                                 int64_t kernel_h, int64_t kernel_w, int64_t stride_h,
                                 int64_t stride_w, int64_t dilation_h, int64_t dilation_w,
                                 int threads) {
    const int64_t positions = out_h * out_w, weights = channels * kernel_h * kernel_w;
    const struct geometry geo = {out_h, out_w, channels_out, stride_h * width, stride_w};
    int64_t *off = malloc(sizeof(int64_t) * (size_t)weights);
    if (off == NULL) return -1;
    for (int64_t c = 0, k = 0; c < channels; c++)
        for (int64_t ky = 0; ky < kernel_h; ky++)
            for (int64_t kx = 0; kx < kernel_w; kx++, k++)
                off[k] = c * height * width + ky * dilation_h * width + kx * dilation_w;
    int failed = 0;
    (void)threads;
#pragma omp parallel num_threads(threads) reduction(| : failed)
    {
        float *gt = malloc(sizeof(float) * (size_t)(positions * channels_out));
        if (gt == NULL) failed = 1;
#pragma omp for schedule(static)
        for (int64_t b = 0; b < batch; b++) {
            if (gt == NULL) continue;
            const float *gb = g + b * channels_out * positions;
            for (int64_t o = 0; o < channels_out; o++)
                for (int64_t p = 0; p < positions; p++) gt[p * channels_out + o] = gb[o * positions + p];
            const float *xb = x + b * channels * height * width;
            float *ob_out = out + b * weights * channels_out;
            for (int64_t ob = 0; ob < channels_out / 8;) {
                const int64_t left = channels_out / 8 - ob;
                const int64_t blocks = left >= 4 ? 4 : left >= 2 ? 2 : 1;
                const tile_fn *tiles = blocks == 4 ? TILES4 : blocks == 2 ? TILES2 : TILES1;
                const int64_t most = blocks == 4 ? MOST4 : blocks == 2 ? MOST2 : MOST1;
                for (int64_t k = 0; k < weights; k += most) {
                    const int64_t t = weights - k < most ? weights - k : most;
                    tiles[t](xb, gt, off + k, ob_out + k * channels_out, &geo, ob);
                }
                ob += blocks;
            }
        }
        free(gt);
    }
    free(off);
    return failed ? -1 : 0;
}
