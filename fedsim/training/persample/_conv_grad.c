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
 * kernel only then, as it was measured only there). Where the CPU has AVX-512 the blocks are
 * 16 channels wide and the tiles hold up to 16 accumulators in its 32 registers (a last block
 * of 8 channels takes the 8-wide tiles): the DP MNIST CNN's two layers took 2.4-2.5 and
 * 1.8-1.9 ms at B = 256 against 3.4-3.7 and 2.0-2.9 with 8-wide blocks (Intel Xeon with
 * AVX-512, one thread, best of 15). Each value is the same sum in the same order whatever
 * the width (a lane's accumulator runs over the positions in order), so the widths agree to
 * the bit.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef float v8 __attribute__((vector_size(32)));
#if defined(__AVX512F__)
#define WIDE 16
typedef float vwide __attribute__((vector_size(64)));
#else
#define WIDE 8
typedef v8 vwide;
#endif

/* Unaligned loads and stores of a vector of type VT (memcpy: no aliasing assumptions). */
#define LOADV(VT, p) ({ VT v_; memcpy(&v_, (p), sizeof v_); v_; })
#define STOREV(p, v) do { __typeof__(v) v_ = (v); memcpy((p), &v_, sizeof v_); } while (0)

struct geometry {
    int64_t out_h, out_w, channels_out, row_step, col_step;
};

/* One tile: OB blocks of W output channels (from block ob0) x T kernel weights (offsets
 * off[0..T)), named NAME_OB_T, on vectors VT of W floats. 8 wide (AVX2): at most 12
 * accumulators: with the OB vectors of g and one broadcast, 15 of AVX2's 16 registers for
 * OB = 1 and 2; the 4 x 3 tile needs 17 and spills one. 16 wide (AVX-512, 32 registers): at
 * most 16 (4 x 4, 2 x 8, 1 x 16 measured fastest: 20 and 24 spilled and were slower). */
#define DEFINE_TILE(NAME, VT, W, OB, T)                                                      \
    static void NAME##_##OB##_##T(const float *restrict x, const float *restrict gt,         \
                                const int64_t *restrict offsets, float *restrict out,        \
                                const struct geometry *geo, int64_t ob0) {                  \
        VT acc[OB][T];                                                                       \
        int64_t off[T];                                                                      \
        _Pragma("GCC unroll 16") for (int t = 0; t < T; t++) off[t] = offsets[t];            \
        _Pragma("GCC unroll 16") for (int j = 0; j < OB; j++)                                \
            _Pragma("GCC unroll 16") for (int t = 0; t < T; t++) acc[j][t] = (VT){0};        \
        const float *gs = gt + ob0 * W;                                                      \
        for (int64_t oy = 0; oy < geo->out_h; oy++) {                                        \
            const float *xs = x + oy * geo->row_step;                                        \
            for (int64_t ox = 0; ox < geo->out_w; ox++, xs += geo->col_step,                 \
                         gs += geo->channels_out) {                                          \
                VT gv[OB];                                                                   \
                _Pragma("GCC unroll 16") for (int j = 0; j < OB; j++) gv[j] = LOADV(VT, gs + W * j); \
                _Pragma("GCC unroll 16") for (int t = 0; t < T; t++) {                       \
                    const float xv = xs[off[t]];                                             \
                    _Pragma("GCC unroll 16") for (int j = 0; j < OB; j++) acc[j][t] += gv[j] * xv; \
                }                                                                            \
            }                                                                                \
        }                                                                                    \
        _Pragma("GCC unroll 16") for (int t = 0; t < T; t++)                                 \
            _Pragma("GCC unroll 16") for (int j = 0; j < OB; j++)                            \
                STOREV(out + t * geo->channels_out + ob0 * W + W * j, acc[j][t]);            \
    }

typedef void (*tile_fn)(const float *, const float *, const int64_t *, float *,
                        const struct geometry *, int64_t);

#define NARROW_TILES(OB, T) DEFINE_TILE(narrow, v8, 8, OB, T)
#define WIDE_TILES(OB, T) DEFINE_TILE(wide, vwide, 16, OB, T)

/* One block of 8 channels: every block's tiles for T = 1..12 without AVX-512, the last block's
 * (channels_out an odd multiple of 8) with it. */
NARROW_TILES(1, 1) NARROW_TILES(1, 2) NARROW_TILES(1, 3) NARROW_TILES(1, 4)
NARROW_TILES(1, 5) NARROW_TILES(1, 6) NARROW_TILES(1, 7) NARROW_TILES(1, 8)
NARROW_TILES(1, 9) NARROW_TILES(1, 10) NARROW_TILES(1, 11) NARROW_TILES(1, 12)
#define MOST_NARROW 12
static const tile_fn TILES_NARROW[] = {0, narrow_1_1, narrow_1_2, narrow_1_3, narrow_1_4,
                                       narrow_1_5, narrow_1_6, narrow_1_7, narrow_1_8,
                                       narrow_1_9, narrow_1_10, narrow_1_11, narrow_1_12};

#if WIDE == 16
WIDE_TILES(4, 1) WIDE_TILES(4, 2) WIDE_TILES(4, 3) WIDE_TILES(4, 4)
WIDE_TILES(2, 1) WIDE_TILES(2, 2) WIDE_TILES(2, 3) WIDE_TILES(2, 4)
WIDE_TILES(2, 5) WIDE_TILES(2, 6) WIDE_TILES(2, 7) WIDE_TILES(2, 8)
WIDE_TILES(1, 1) WIDE_TILES(1, 2) WIDE_TILES(1, 3) WIDE_TILES(1, 4)
WIDE_TILES(1, 5) WIDE_TILES(1, 6) WIDE_TILES(1, 7) WIDE_TILES(1, 8)
WIDE_TILES(1, 9) WIDE_TILES(1, 10) WIDE_TILES(1, 11) WIDE_TILES(1, 12)
WIDE_TILES(1, 13) WIDE_TILES(1, 14) WIDE_TILES(1, 15) WIDE_TILES(1, 16)
#define MOST4 4
#define MOST2 8
#define MOST1 16
static const tile_fn TILES4[] = {0, wide_4_1, wide_4_2, wide_4_3, wide_4_4};
static const tile_fn TILES2[] = {0, wide_2_1, wide_2_2, wide_2_3, wide_2_4, wide_2_5, wide_2_6,
                                 wide_2_7, wide_2_8};
static const tile_fn TILES1[] = {0, wide_1_1, wide_1_2, wide_1_3, wide_1_4, wide_1_5, wide_1_6,
                                 wide_1_7, wide_1_8, wide_1_9, wide_1_10, wide_1_11, wide_1_12,
                                 wide_1_13, wide_1_14, wide_1_15, wide_1_16};
#else
NARROW_TILES(4, 1) NARROW_TILES(4, 2) NARROW_TILES(4, 3)
NARROW_TILES(2, 1) NARROW_TILES(2, 2) NARROW_TILES(2, 3) NARROW_TILES(2, 4)
NARROW_TILES(2, 5) NARROW_TILES(2, 6)
#define MOST4 3
#define MOST2 6
#define MOST1 MOST_NARROW
static const tile_fn TILES4[] = {0, narrow_4_1, narrow_4_2, narrow_4_3};
static const tile_fn TILES2[] = {0, narrow_2_1, narrow_2_2, narrow_2_3, narrow_2_4, narrow_2_5,
                                 narrow_2_6};
#define TILES1 TILES_NARROW
#endif

int fedsim_conv_grad_vectorised(void) {
#if defined(__AVX2__) && defined(__FMA__)
    return 1;
#else
    return 0;
#endif
}

/* One block (of the tiles' width, index ob0) of one example over all its kernel weights: tiles
 * of `most` weights, the last one shorter. */
static void sweep(const tile_fn *tiles, int64_t most, const float *xb, const float *gt,
                  const int64_t *off, float *out, const struct geometry *geo, int64_t weights,
                  int64_t ob0) {
    for (int64_t k = 0; k < weights; k += most) {
        const int64_t t = weights - k < most ? weights - k : most;
        tiles[t](xb, gt, off + k, out + k * geo->channels_out, geo, ob0);
    }
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
            for (int64_t ob = 0; ob < channels_out / WIDE;) {  /* ob: a block of WIDE channels */
                const int64_t left = channels_out / WIDE - ob;
                const int64_t blocks = left >= 4 ? 4 : left >= 2 ? 2 : 1;
                const tile_fn *tiles = blocks == 4 ? TILES4 : blocks == 2 ? TILES2 : TILES1;
                const int64_t most = blocks == 4 ? MOST4 : blocks == 2 ? MOST2 : MOST1;
                sweep(tiles, most, xb, gt, off, ob_out, &geo, weights, ob);
                ob += blocks;
            }
#if WIDE == 16
            if (channels_out % 16)  /* the last 8 channels: block channels_out / 8 - 1 of 8 */
                sweep(TILES_NARROW, MOST_NARROW, xb, gt, off, ob_out, &geo, weights,
                      channels_out / 8 - 1);
#endif
        }
        free(gt);
    }
    free(off);
    return failed ? -1 : 0;
}
