/* host_draw.draw's draw over whole rows, compiled: each row's min-p and top-p kept ids and the inverse-CDF
 * pick among them, in a few passes over the row, where numpy makes about a dozen over memory (whole_draw.py
 * loads this file's library with ctypes and says which rows it takes).
 *
 * A row is temperature-scaled float64 logits (V,). Per row: (1) its largest and lowest values; (2) each id's
 * weight, exp of its value less the largest (0 under min-p's edge or at -inf), into the caller's buffer;
 * (3) under top-p, the weights' sums by buckets of value, as host_draw.top_p_edge's, and only the crossing
 * bucket's ids sorted (value descending, lower id first); (4) the kept weights' sums by blocks of BLOCK ids,
 * then one block's running sum for the pick. Sums run in id order, as the definition's running sum does;
 * a pick may differ from the definition's only where the uniform number falls within about 1e-15 of an
 * id's edge. exp is this file's own (exp_neg): the same bits on every machine and in every vector width.
 *
 * No allocation but the crossing bucket's sort buffer, and no state: callers may run it from several
 * threads at once, each with buffers of its own.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h> /* first, as Python asks: only for the module's PyInit, which ctypes never calls */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define BLOCK 64
#define FEW 8
#define BUCKETS 4096

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_whole_draw", "The host's compiled whole-row draw: loaded by whole_draw.py with ctypes.", -1,
    NULL, NULL, NULL, NULL, NULL};

/* An importable module (pkgutil and the import system list it as one), holding nothing of its own. */
PyMODINIT_FUNC PyInit__whole_draw(void) { return PyModule_Create(&module); }

/* Whether this machine runs the code below: on x86-64 it is built for AVX2 and FMA (every x86 server
 * since 2013 has both; where one lacks them, host_draw's numpy draws instead). */
int whole_draw_supported(void) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    return 1;
#endif
}

#if defined(__x86_64__) && defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma"))), apply_to = function)
#elif defined(__x86_64__) && defined(__GNUC__)
#pragma GCC target("avx2,fma")
#endif
#pragma GCC diagnostic ignored "-Wpsabi" /* the vector types never cross this file's edge */

/* Four lanes of float64 and of 64-bit integers (GCC's and Clang's vector extensions): the arithmetic and
 * the order of every sum are those of four lanes, whatever width the machine's vectors have. */
typedef double lanes __attribute__((vector_size(32)));
typedef int64_t masks __attribute__((vector_size(32)));

static inline lanes load(const double *at) {
    lanes v;
    memcpy(&v, at, sizeof v);
    return v;
}

/* Four values from `at`, those at or past `end` `fill`. */
static inline lanes load_upto(const double *row, int64_t at, int64_t end, double fill) {
    if (at + 4 <= end) return load(row + at);
    lanes v = {fill, fill, fill, fill};
    for (int64_t j = 0; at + j < end; j++) v[j] = row[at + j];
    return v;
}

static inline void store_upto(double *row, int64_t at, int64_t end, lanes v) {
    if (at + 4 <= end) {
        memcpy(row + at, &v, sizeof v);
        return;
    }
    for (int64_t j = 0; at + j < end; j++) row[at + j] = v[j];
}

static inline lanes only(masks keep, lanes v) { return (lanes)((masks)v & keep); }

/* e^x for x <= 0 (0 below -708, at -inf and at NaN), within about 1 ulp: 2^k e^r with k = round(x / ln 2)
 * and |r| <= ln 2 / 2 by Cody and Waite's split of ln 2, e^r by its Taylor series to r^13 (the rest under
 * 1e-17). */
static inline lanes exp_neg(lanes x) {
    const double log2e = 1.4426950408889634, ln2_hi = 6.93147180369123816490e-01;
    const double ln2_lo = 1.90821492927058770002e-10, shifter = 6755399441055744.0; /* 1.5 * 2^52 */
    masks inside = x > -708.0;
    lanes clamped = (lanes)(((masks)x & inside) | ((masks)(x * 0.0 - 708.0) & ~inside));
    lanes shifted = clamped * log2e + shifter; /* round to nearest: k in the low bits */
    lanes k = shifted - shifter;
    lanes r = (clamped - k * ln2_hi) - k * ln2_lo;
    lanes p = r * (1.0 / 6227020800.0) + 1.0 / 479001600.0;
    p = p * r + 1.0 / 39916800.0;
    p = p * r + 1.0 / 3628800.0;
    p = p * r + 1.0 / 362880.0;
    p = p * r + 1.0 / 40320.0;
    p = p * r + 1.0 / 5040.0;
    p = p * r + 1.0 / 720.0;
    p = p * r + 1.0 / 120.0;
    p = p * r + 1.0 / 24.0;
    p = p * r + 1.0 / 6.0;
    p = p * r + 0.5;
    p = p * r + 1.0;
    p = p * r + 1.0;
    lanes scale = (lanes)(((masks)shifted + 1023) << 52); /* 2^k: k's two's complement sits in the low bits */
    return only(inside, p * scale);
}

typedef struct {
    double value;
    int64_t id;
} Member;

static int descending(const void *a, const void *b) {
    const Member *x = a, *y = b;
    if (x->value != y->value) return x->value > y->value ? -1 : 1;
    return x->id < y->id ? -1 : (x->id > y->id);
}

/* host_draw.buckets */
static int64_t bucket_count(int64_t size) {
    int64_t count = size / 8;
    return count < 16 ? 16 : (count > BUCKETS ? BUCKETS : count);
}

/* host_draw.top_p_edge over one row's weights, each id's bucket of value in `buckets` (overwritten): the
 * last kept id's value; the ids tied at it that the crossing does not take set to weigh 0. -2 where the
 * sort buffer could not be had, -1 where the crossing bucket weighs nothing (host_draw's to draw). */
static int top_p_edge(const double *restrict row, double largest, int64_t size, double top_p, double *restrict weights,
                      int32_t *restrict buckets, int64_t count, double *edge) {
    double mass[BUCKETS];
    memset(mass, 0, sizeof(double) * count);
    for (int64_t i = 0; i < size; i++) mass[buckets[i]] += weights[i];
    double total = 0.0;
    for (int64_t b = 0; b < count; b++) total += mass[b];
    double target = top_p * total, before = 0.0;
    int32_t crossing = 0;
    for (int64_t b = 0; b < count; b++) { /* the last bucket with less than target above it */
        if (before < target) crossing = (int32_t)b;
        before += mass[b];
    }
    before = 0.0;
    for (int64_t b = 0; b < crossing; b++) before += mass[b];
    int64_t members = 0;
    for (int64_t i = 0; i < size; i++) { /* the crossing bucket's ids, in place at the buffer's start */
        int32_t bucket = buckets[i];
        buckets[members] = (int32_t)i;
        members += bucket == crossing && weights[i] > 0.0;
    }
    Member *inside = malloc(sizeof(Member) * (members ? members : 1));
    if (!inside) return -2;
    for (int64_t j = 0; j < members; j++) inside[j] = (Member){row[buckets[j]] - largest, buckets[j]};
    if (!members) { /* not met: the crossing bucket holds weight, or a later one would be the crossing */
        free(inside);
        return -1;
    }
    qsort(inside, members, sizeof(Member), descending);
    int64_t taken = 0;
    double running = before;
    for (int64_t j = 0; j < members; j++) {
        taken += running < target;
        running += weights[inside[j].id];
    }
    double last = inside[taken - 1].value;
    for (int64_t j = taken; j < members; j++)
        if (inside[j].value == last) weights[inside[j].id] = 0.0;
    free(inside);
    *edge = last;
    return 0;
}

/* The inverse CDF over a row's kept weights (weights at ids valued under `edge` taken as 0): of the ids of
 * nonzero weight, in id order, the first whose cumulative weight passes `uniform` times their total; the
 * last of them where rounding leaves none. */
static int64_t pick(const double *row, double largest, double edge, int64_t size, double *weights,
                    double uniform) {
    int64_t blocks = (size + BLOCK - 1) / BLOCK;
    double sums[(size + BLOCK - 1) / BLOCK];
    double total = 0.0;
    for (int64_t b = 0; b < blocks; b++) { /* four running sums a block, added in one order */
        int64_t start = b * BLOCK, end = start + BLOCK < size ? start + BLOCK : size;
        lanes sum = {0.0, 0.0, 0.0, 0.0};
        for (int64_t i = start; i < end; i += 4) {
            lanes w = only(load_upto(row, i, end, -INFINITY) - largest >= edge, load_upto(weights, i, end, 0.0));
            store_upto(weights, i, end, w);
            sum += w;
        }
        sums[b] = (sum[0] + sum[1]) + (sum[2] + sum[3]);
        total += sums[b];
    }
    double target = uniform * total, running = 0.0;
    for (int64_t b = 0; b < blocks; b++) {
        if (running + sums[b] > target) { /* the block where the running sum passes the target */
            int64_t start = b * BLOCK, end = start + BLOCK < size ? start + BLOCK : size, found = -1;
            for (int64_t i = start; i < end; i++) {
                running += weights[i];
                if (running > target) return i;
                found = weights[i] > 0.0 ? i : found;
            }
            return found; /* rounding: the block's own sum passed it, its running sum not */
        }
        running += sums[b];
    }
    for (int64_t i = size - 1; i >= 0; i--)
        if (weights[i] > 0.0) return i;
    return -1;
}

/* One row's id, or -1 where host_draw would take min-p's few ids (at most size / FEW kept) or every id is
 * -inf; -2 where memory ran out. */
static int64_t draw_row(const double *restrict row, int64_t size, double min_p, double top_p, double uniform,
                        double *restrict weights, int32_t *restrict buckets) {
    lanes high = {-INFINITY, -INFINITY, -INFINITY, -INFINITY}, low = {INFINITY, INFINITY, INFINITY, INFINITY};
    for (int64_t i = 0; i + 4 <= size; i += 4) {
        lanes v = load(row + i);
        high = (lanes)(((masks)v & (v > high)) | ((masks)high & ~(v > high)));
        low = (lanes)(((masks)v & (v < low)) | ((masks)low & ~(v < low)));
    }
    double largest = -INFINITY, lowest = INFINITY;
    for (int64_t j = 0; j < 4; j++) {
        largest = high[j] > largest ? high[j] : largest;
        lowest = low[j] < lowest ? low[j] : lowest;
    }
    for (int64_t i = size - size % 4; i < size; i++) {
        largest = row[i] > largest ? row[i] : largest;
        lowest = row[i] < lowest ? row[i] : lowest;
    }
    if (largest == -INFINITY) return -1;
    double edge = min_p > 0.0 ? log(min_p) : -INFINITY;
    for (int64_t i = 0; i < size; i += 4) {
        lanes shifted = load_upto(row, i, size, -INFINITY) - largest;
        store_upto(weights, i, size, only(shifted >= edge, exp_neg(shifted)));
    }
    if (edge > -INFINITY) {
        int64_t kept = 0;
        for (int64_t i = 0; i < size; i++) kept += row[i] - largest >= edge;
        if (kept <= size / FEW) return -1;
    }
    if (top_p < 1.0) { /* each id's bucket of value, as host_draw.top_p_edge's: the largest in bucket 0 */
        int64_t count = bucket_count(size);
        double low = lowest - largest > -64.0 ? lowest - largest : -64.0; /* lower: the last bucket */
        double scale = low < 0.0 ? (double)(count - 1) / low : 0.0, top = (double)(count - 1);
        for (int64_t i = 0; i < size; i++) {
            double product = (row[i] - largest) * scale; /* -inf ids: +inf */
            buckets[i] = (int32_t)(product < top ? product : top);
        }
        double last;
        int failed = top_p_edge(row, largest, size, top_p, weights, buckets, count, &last);
        if (failed) return failed;
        edge = last > edge ? last : edge;
    }
    return pick(row, largest, edge, size, weights, uniform);
}

/* Each of n rows' id (ids, n int64): rows of `size` float64 values `stride` apart, each with its min-p,
 * top-p and uniform number; `weights` and `buckets` buffers of `size` float64 and int32. -1 for a row
 * host_draw draws otherwise; -2 where memory ran out. */
void whole_draws(const double *rows, int64_t n, int64_t size, int64_t stride, const double *min_p,
                 const double *top_p, const double *uniform, double *weights, int32_t *buckets, int64_t *ids) {
    for (int64_t r = 0; r < n; r++)
        ids[r] = draw_row(rows + r * stride, size, min_p[r], top_p[r], uniform[r], weights, buckets);
}

#if defined(__x86_64__) && defined(__clang__)
#pragma clang attribute pop
#endif
