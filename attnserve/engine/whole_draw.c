/* host_draw.draw's draw over whole rows, compiled: each row's min-p and top-p kept ids and the inverse-CDF
 * pick among them, in three passes over the row where numpy makes about a dozen (whole_draw.py loads this
 * file's library with ctypes and says which rows it takes).
 *
 * A row is float64 values already divided by their temperature (whole_draws), or float32 logits divided by
 * it as they are read, the same float64 division (whole_draws_logits: no copy of the row). Per row: (1) its
 * largest value and its lowest but -inf; (2) each id's weight, exp of its value less the largest (0 under
 * min-p's edge or at -inf), into the caller's buffer, and under top-p the weights' sums by bucket of value
 * (as many as host_draw.top_p_edge's, spanning the values but -inf where its span takes -inf's in too); then
 * the values that bound the crossing bucket, found by halves (an id's bucket falls as its value rises, so a
 * bucket is a range of values), and only the ids between them are sorted (value descending, lower id
 * first), those top-p does not take set to weigh 0; (3) the kept weights' sums (ids at or above the
 * crossing bucket's lowest value) by blocks of BLOCK ids up to the block where the pick falls, then that
 * block's running sum. Without top-p the weights are not stored: the weights pass keeps each block's sum, and
 * the pick weighs the block where it falls again (the same bits). Sums run in id order (by four lanes within
 * a block), as the definition's running sum does: a pick may differ from the definition's only where the
 * uniform number falls within about 1e-15 of an id's edge. exp is this file's own (exp_neg): the same bits on
 * every machine and in every vector width.
 *
 * A float32 row under penalties or a bias is drawn from its logits too (whole_draw_processed): the changed
 * ids' values are patched in as the row is read (their lanes in the weights pass, their values
 * where the extremes, top-p's crossing and the pick's kept ids are found), instead of a float64 copy of it.
 *
 * And a greedy row's log-probabilities (whole_draw_scores): its likeliest ids but its bans, and the sum of
 * its exps, in two passes over the float32 logits.
 *
 * A row of SPLIT_FROM ids or more is read in two parts (split_at: passes (1) and (2), and a greedy row's
 * exps), each part's sums its own, added part by part: the same bits whichever thread reads a part. Between
 * whole_draw_wake and whole_draw_rest, a single row's call lends the second part to a helper thread and reads
 * the first itself (about 0.65x the time of a row of 50,257 ids on two cores).
 *
 * No allocation but the crossing bucket's sort buffer and a penalized row's patches, and no state but the
 * helper's: callers may run it from several threads at once, each with buffers of its own (one at a time
 * has the helper, the others read both parts themselves).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h> /* first, as Python asks: only for the module's PyInit, which ctypes never calls */
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#if defined(__unix__) || defined(__APPLE__)
#include <pthread.h>
#include <sched.h>
#include <time.h>
#define HELPER 1 /* a row's second part may run on a helper thread */
#endif

#define BLOCK 64
#define FEW 8
#define BUCKETS 4096
#define BLOCK_OF_BUCKETS 32
#define CHAINS 4 /* exps computed side by side in the weights pass */
#define SPLIT_FROM 8192 /* ids: a row this long is read in two parts (split_at), the same bits on one thread or two */
#define AWAKE_NS 5000000 /* ns: woken ahead of a step's rows (whole_draw_wake), the helper takes parts this long at most */

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
 * 1e-17). Of `n` sets of four at once, each step of the series taken for every set before the next: the
 * sets' chains of multiply-adds interleave, so none waits on the one before it (the same bits either way). */
static inline void exps_neg(int n, const lanes *x, lanes *out) {
    const double log2e = 1.4426950408889634, ln2_hi = 6.93147180369123816490e-01;
    const double ln2_lo = 1.90821492927058770002e-10, shifter = 6755399441055744.0; /* 1.5 * 2^52 */
    static const double series[] = {1.0 / 479001600.0, 1.0 / 39916800.0, 1.0 / 3628800.0, 1.0 / 362880.0,
                                    1.0 / 40320.0,     1.0 / 5040.0,     1.0 / 720.0,      1.0 / 120.0,
                                    1.0 / 24.0,        1.0 / 6.0,        0.5,              1.0,
                                    1.0};
    const lanes least = {-708.0, -708.0, -708.0, -708.0};
    masks inside[CHAINS];
    lanes shifted[CHAINS], r[CHAINS], p[CHAINS];
#pragma GCC unroll 4
    for (int s = 0; s < n; s++) {
        inside[s] = x[s] > -708.0;
        lanes clamped = (lanes)(((masks)x[s] & inside[s]) | ((masks)least & ~inside[s]));
        shifted[s] = clamped * log2e + shifter; /* round to nearest: k in the low bits */
        lanes k = shifted[s] - shifter;
        r[s] = (clamped - k * ln2_hi) - k * ln2_lo;
        p[s] = r[s] * (1.0 / 6227020800.0) + series[0];
    }
    for (int term = 1; term < (int)(sizeof series / sizeof *series); term++)
#pragma GCC unroll 4
        for (int s = 0; s < n; s++) p[s] = p[s] * r[s] + series[term];
#pragma GCC unroll 4
    for (int s = 0; s < n; s++) {
        lanes scale = (lanes)(((masks)shifted[s] + 1023) << 52); /* 2^k: k's two's complement in the low bits */
        out[s] = only(inside[s], p[s] * scale);
    }
}

static inline lanes exp_neg(lanes x) {
    lanes out;
    exps_neg(1, &x, &out);
    return out;
}

typedef int32_t quads __attribute__((vector_size(16)));
typedef float floats __attribute__((vector_size(16)));

/* A row: float32 logits, each divided by the temperature as it is read (numpy's float64 division of
 * sampling.processed_row, so the very values), or float64 values taken as they are. A float32 row may have
 * some of its ids' values given instead (`patched`, ascending, each once; `patches`, float64 as read, before
 * the temperature: a penalized id's, as processed_row leaves it before its division). */
typedef struct {
    const float *f32;
    const double *f64;
    double temperature;
    int64_t size;
    const int32_t *patched;
    const double *patches;
    int64_t patch_count;
} Row;

/* Four of the row's values from `at` as read, before the temperature (-inf past its end). */
static inline lanes raw_at(const Row *row, int64_t at) {
    if (!row->f32) return load_upto(row->f64, at, row->size, -INFINITY);
    if (at + 4 <= row->size) {
        floats v;
        memcpy(&v, row->f32 + at, sizeof v);
        return __builtin_convertvector(v, lanes);
    }
    lanes v = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
    for (int64_t j = 0; at + j < row->size; j++) v[j] = row->f32[at + j];
    return v;
}

static inline lanes values_at(const Row *row, int64_t at) {
    return row->f32 ? raw_at(row, at) / row->temperature : raw_at(row, at);
}

typedef float octets __attribute__((vector_size(32)));
typedef int32_t octet_masks __attribute__((vector_size(32)));

/* Whether any of eight lanes is set: one movemask on x86-64, else the eight as four 64-bit lanes. */
static inline int any_set(octet_masks m) {
#if defined(__x86_64__)
    return _mm256_movemask_ps((__m256)m) != 0;
#else
    masks pairs = (masks)m;
    return ((pairs[0] | pairs[1]) | (pairs[2] | pairs[3])) != 0;
#endif
}

/* The largest value and the smallest but -inf as read of the row's ids [start, end), taken into `high` and `low`
 * (patches aside): eight lanes of float32, or two sets of four of float64, so that no lane waits on the one
 * before it. */
static void extremes_between(const Row *row, int64_t start, int64_t end, double *high, double *low) {
    int64_t i = start;
    if (row->f32) {
        octets top = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
        octets bottom = -top, top2 = top, bottom2 = bottom;
        for (; i + 16 <= end; i += 16) {
            octets v, w;
            memcpy(&v, row->f32 + i, sizeof v);
            memcpy(&w, row->f32 + i + 8, sizeof w);
            octet_masks low_v = (v < bottom) & (v > -INFINITY), low_w = (w < bottom2) & (w > -INFINITY);
            top = (octets)(((octet_masks)v & (v > top)) | ((octet_masks)top & ~(v > top)));
            bottom = (octets)(((octet_masks)v & low_v) | ((octet_masks)bottom & ~low_v));
            top2 = (octets)(((octet_masks)w & (w > top2)) | ((octet_masks)top2 & ~(w > top2)));
            bottom2 = (octets)(((octet_masks)w & low_w) | ((octet_masks)bottom2 & ~low_w));
        }
        for (int j = 0; j < 8; j++) {
            *high = fmax(*high, fmax(top[j], top2[j]));
            *low = fmin(*low, fmin(bottom[j], bottom2[j]));
        }
        for (; i < end; i++) {
            *high = row->f32[i] > *high ? row->f32[i] : *high;
            *low = row->f32[i] < *low && row->f32[i] > -INFINITY ? row->f32[i] : *low;
        }
    } else {
        lanes top = {-INFINITY, -INFINITY, -INFINITY, -INFINITY}, bottom = -top, top2 = top, bottom2 = bottom;
        for (; i + 8 <= end; i += 8) {
            lanes v = load(row->f64 + i), w = load(row->f64 + i + 4);
            masks low_v = (v < bottom) & (v > -INFINITY), low_w = (w < bottom2) & (w > -INFINITY);
            top = (lanes)(((masks)v & (v > top)) | ((masks)top & ~(v > top)));
            bottom = (lanes)(((masks)v & low_v) | ((masks)bottom & ~low_v));
            top2 = (lanes)(((masks)w & (w > top2)) | ((masks)top2 & ~(w > top2)));
            bottom2 = (lanes)(((masks)w & low_w) | ((masks)bottom2 & ~low_w));
        }
        for (int j = 0; j < 4; j++) {
            *high = fmax(*high, fmax(top[j], top2[j]));
            *low = fmin(*low, fmin(bottom[j], bottom2[j]));
        }
        for (; i < end; i++) {
            *high = row->f64[i] > *high ? row->f64[i] : *high;
            *low = row->f64[i] < *low && row->f64[i] > -INFINITY ? row->f64[i] : *low;
        }
    }
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

/* host_draw.top_p_edge's crossing, from the weights' sums by bucket (mass, `count` of them): the last bucket with
 * less than top_p of the total above it, and the weight of the buckets above it. The total by four lanes; the
 * walk down the buckets by blocks of BLOCK_OF_BUCKETS, each block's sum by four lanes, id by id only within
 * the block where the target is passed (no chain of count additions, one waiting on the next). */
static int32_t crossing_bucket(const double *mass, int64_t count, double top_p, double *before, double *target) {
    lanes lane_sums = {0.0, 0.0, 0.0, 0.0};
    for (int64_t b = 0; b < count; b += 4) lane_sums += load_upto(mass, b, count, 0.0);
    *target = top_p * ((lane_sums[0] + lane_sums[1]) + (lane_sums[2] + lane_sums[3]));
    double running = 0.0; /* the weight above bucket b, less than the target */
    for (int64_t start = 0; start < count; start += BLOCK_OF_BUCKETS) {
        int64_t end = start + BLOCK_OF_BUCKETS < count ? start + BLOCK_OF_BUCKETS : count;
        lanes sums = {0.0, 0.0, 0.0, 0.0};
        for (int64_t b = start; b < end; b += 4) sums += load_upto(mass, b, end, 0.0);
        if (end < count && running + ((sums[0] + sums[1]) + (sums[2] + sums[3])) < *target) {
            running += (sums[0] + sums[1]) + (sums[2] + sums[3]);
            continue;
        }
        for (int64_t b = start; b < end; b++) {
            if (running + mass[b] >= *target || b == count - 1) {
                *before = running;
                return (int32_t)b;
            }
            running += mass[b];
        }
    }
    *before = 0.0; /* not reached: the last bucket returns */
    return (int32_t)(count - 1);
}

/* Top-p's buckets of value: an id's is its value less the largest, times `scale` (<= 0), cut to a whole
 * number, `top` (the last) where that is not below it (-inf values, and those more than 64 below the
 * largest). */
typedef struct {
    double largest, scale, top;
} Bucketing;

/* The bucket of a value as read (before the temperature): the weights pass's arithmetic, one value at a time. */
static int32_t bucket_of(const Row *row, const Bucketing *by, double raw) {
    double product = ((row->f32 ? raw / row->temperature : raw) - by->largest) * by->scale;
    return product < by->top ? (int32_t)product : (int32_t)by->top;
}

/* Doubles as 64-bit integers in the same order (-0 and +0 as one), and back. */
static int64_t ordered(double x) {
    int64_t bits;
    memcpy(&bits, &x, sizeof bits);
    return bits >= 0 ? bits : INT64_MIN - bits;
}

static double from_ordered(int64_t key) {
    int64_t bits = key >= 0 ? key : INT64_MIN - key;
    double x;
    memcpy(&x, &bits, sizeof x);
    return x;
}

/* The lowest value as read whose bucket is `bucket` or above it (a lower number): the ids at or above it are
 * those buckets' ids, and none below it is. -inf where the row's lowest value but -inf (`low`) is one; else
 * by halves of the doubles between `low` and the largest value as read (`high`, bucket 0), at most 64. */
static double lowest_at_most(const Row *row, const Bucketing *by, double low, double high, int32_t bucket) {
    if (bucket_of(row, by, low) <= bucket) return -INFINITY;
    int64_t below = ordered(low), at = ordered(high); /* below's bucket is past `bucket`, at's is not */
    while ((uint64_t)at - (uint64_t)below > 1) {
        int64_t middle = (int64_t)((uint64_t)below + ((uint64_t)at - (uint64_t)below) / 2);
        if (bucket_of(row, by, from_ordered(middle)) <= bucket)
            at = middle;
        else
            below = middle;
    }
    return from_ordered(at);
}

/* The smallest float32 at or above x (within float32's range, or infinite): a float32 is at or above it
 * exactly when it is at or above x. */
static float float_at_or_above(double x) {
    float f = (float)x;
    return (double)f < x ? nextafterf(f, INFINITY) : f;
}

/* The row's value `i` as read. */
static inline double raw_value(const Row *row, int64_t i) { return row->f32 ? (double)row->f32[i] : row->f64[i]; }

/* The id of the row's patch `p`, INT64_MAX past the last. */
static inline int64_t patch_id(const Row *row, int64_t p) { return p < row->patch_count ? row->patched[p] : INT64_MAX; }

/* The first of the row's patches at or past id `start`, and its id (INT64_MAX where none is). */
static int64_t first_patch(const Row *row, int64_t start, int64_t *next) {
    int64_t low = 0, high = row->patch_count;
    while (low < high) {
        int64_t middle = low + (high - low) / 2;
        if (row->patched[middle] < start)
            low = middle + 1;
        else
            high = middle;
    }
    *next = patch_id(row, low);
    return low;
}

/* Where id `i` is among the row's patched ids, or -1. */
static int64_t patch_of(const Row *row, int64_t i) {
    int64_t next, p = first_patch(row, i, &next);
    return next == i ? p : -1;
}

/* raw_value, a patched id's from its patch. */
static inline double read_value(const Row *row, int64_t i) {
    int64_t p = row->patch_count ? patch_of(row, i) : -1;
    return p < 0 ? raw_value(row, i) : row->patches[p];
}

/* Whether any of the 32 values from `at` (float32, or float64) is in [low, high). */
static inline int any_between32(const float *at, octets low, octets high) {
    octet_masks hit = {0};
    for (int k = 0; k < 4; k++) {
        octets v;
        memcpy(&v, at + 8 * k, sizeof v);
        hit |= (v >= low) & (v < high);
    }
    return any_set(hit);
}

static inline int any_between64(const double *at, lanes low, lanes high) {
    masks hit = {0};
    for (int k = 0; k < 8; k++) hit |= (load(at + 4 * k) >= low) & (load(at + 4 * k) < high);
    return any_set((octet_masks)hit); /* a lane of four set: both its halves set */
}

/* Into `members` the ids of nonzero weight whose values as read are in [low, high): the crossing bucket's. 32
 * values tested at a time (most hold none of them), then one by one, in id order; the patched ids apart,
 * after the others, by their patches. */
static int64_t members_between(const Row *row, double low, double high, const double *restrict weights,
                               int32_t *restrict members) {
    int64_t count = 0, i = 0, size = row->size;
    float low32 = row->f32 ? float_at_or_above(low) : 0.0f, high32 = row->f32 ? float_at_or_above(high) : 0.0f;
    const octets lows32 = {low32, low32, low32, low32, low32, low32, low32, low32};
    const octets highs32 = {high32, high32, high32, high32, high32, high32, high32, high32};
    const lanes lows = {low, low, low, low}, highs = {high, high, high, high};
    for (; i + 32 <= size; i += 32) {
        if (row->f32 ? !any_between32(row->f32 + i, lows32, highs32) : !any_between64(row->f64 + i, lows, highs))
            continue;
        for (int64_t j = i; j < i + 32; j++) {
            double v = raw_value(row, j);
            if (v >= low && v < high && weights[j] > 0.0 && (!row->patch_count || patch_of(row, j) < 0))
                members[count++] = (int32_t)j;
        }
    }
    for (; i < size; i++) {
        double v = raw_value(row, i);
        if (v >= low && v < high && weights[i] > 0.0 && (!row->patch_count || patch_of(row, i) < 0))
            members[count++] = (int32_t)i;
    }
    for (int64_t p = 0; p < row->patch_count; p++) {
        double v = row->patches[p];
        if (v >= low && v < high && weights[row->patched[p]] > 0.0) members[count++] = row->patched[p];
    }
    return count;
}

/* The crossing bucket's ids of nonzero weight, by value descending, lower id first: those top-p takes keep
 * their weight, the rest (lower, or tied at the last taken one's value and above it in id) weigh 0 from now
 * on. Returns the kept ids' total weight; -1 where the bucket weighs nothing (host_draw's to draw), -2 where
 * the sort buffer could not be had. `edge`: the crossing bucket's lowest value as read (ids below it are
 * not kept). */
static double take_crossing(const Row *row, const Bucketing *by, double low, double high, int32_t crossing,
                            double before, double target, double *restrict weights, int32_t *restrict members,
                            double *edge) {
    *edge = lowest_at_most(row, by, low, high, crossing);
    double above = crossing > 0 ? lowest_at_most(row, by, low, high, crossing - 1) : INFINITY;
    int64_t count = members_between(row, *edge, above, weights, members);
    if (!count) return -1.0; /* not met: the crossing bucket holds weight, or a later one would be the crossing */
    Member *inside = malloc(sizeof(Member) * count);
    if (!inside) return -2.0;
    for (int64_t j = 0; j < count; j++) {
        double v = row->f32 ? read_value(row, members[j]) / row->temperature : read_value(row, members[j]);
        inside[j] = (Member){v - by->largest, members[j]};
    }
    qsort(inside, count, sizeof(Member), descending);
    int64_t taken = 0;
    double running = before, kept = before;
    for (int64_t j = 0; j < count; j++) {
        taken += running < target;
        running += weights[inside[j].id];
    }
    for (int64_t j = 0; j < count; j++) {
        if (j < taken)
            kept += weights[inside[j].id];
        else
            weights[inside[j].id] = 0.0;
    }
    free(inside);
    return kept;
}

/* Where ids are kept from: a row's values as read at or above `edge` (of float32 values: those at or above
 * `edge32`, the same ones). */
typedef struct {
    const Row *row;
    double edge;
    float edge32;
} Kept;

/* Which of the four ids from `at` are kept (past the row's end: none), patches aside. */
static inline masks kept_at(const Kept *kept, int64_t at) {
    if (!kept->row->f32 || at + 4 > kept->row->size) return raw_at(kept->row, at) >= kept->edge;
    floats v;
    memcpy(&v, kept->row->f32 + at, sizeof v);
    const floats edges = {kept->edge32, kept->edge32, kept->edge32, kept->edge32};
    return __builtin_convertvector(v >= edges, masks);
}

/* kept_at's lanes for the patched ids among the four from `at`, by their patches; `patch` and `next` as
 * patch_lanes moves them. */
__attribute__((noinline)) static masks kept_patched(const Kept *kept, int64_t at, masks keep, int64_t *patch,
                                                   int64_t *next) {
    const Row *row = kept->row;
    for (; patch_id(row, *patch) < at + 4; ++*patch)
        keep[row->patched[*patch] - at] = row->patches[*patch] >= kept->edge ? -1 : 0;
    *next = patch_id(row, *patch);
    return keep;
}

static inline int kept_id(const Kept *kept, int64_t i) { return read_value(kept->row, i) >= kept->edge; }

/* Within the block of ids [start, end) whose weights are `w` (from its first), after `running` of weight
 * before it: the first id whose running sum passes `target`; the last of nonzero weight where none does
 * (rounding: the block's own sum passed it, its running sum not). */
static int64_t walk_block(const double *w, int64_t start, int64_t end, double running, double target) {
    int64_t found = -1;
    for (int64_t i = start; i < end; i++) {
        running += w[i - start];
        if (running > target) return i;
        found = w[i - start] > 0.0 ? i : found;
    }
    return found;
}

/* The inverse CDF over the weights kept_at keeps, whose total is `total`: of the ids of nonzero weight, in id
 * order, the first whose cumulative weight passes `uniform` times the total, found block by block of BLOCK
 * ids; the last of them where rounding leaves none. `patched`: whether the row has patches (a constant where
 * it is inlined, so that a row without them tests none). */
static inline __attribute__((always_inline)) int64_t pick_kept(const double *weights, const Kept *kept,
                                                               int64_t size, double total, double uniform,
                                                               const int patched) {
    double target = uniform * total, running = 0.0;
    int64_t next = INT64_MAX, patch = patched ? first_patch(kept->row, 0, &next) : 0;
    for (int64_t start = 0; start < size; start += BLOCK) {
        int64_t end = start + BLOCK < size ? start + BLOCK : size;
        lanes sum = {0.0, 0.0, 0.0, 0.0};
        for (int64_t i = start; i < end; i += 4) {
            masks keep = kept_at(kept, i);
            if (patched && next < i + 4) keep = kept_patched(kept, i, keep, &patch, &next);
            sum += only(keep, load_upto(weights, i, end, 0.0));
        }
        double block = (sum[0] + sum[1]) + (sum[2] + sum[3]);
        if (running + block > target) {
            double w[BLOCK];
            for (int64_t i = start; i < end; i++) w[i - start] = kept_id(kept, i) ? weights[i] : 0.0;
            return walk_block(w, start, end, running, target);
        }
        running += block;
    }
    for (int64_t i = size - 1; i >= 0; i--)
        if (weights[i] > 0.0 && kept_id(kept, i)) return i;
    return -1;
}

static int64_t pick(const double *weights, const Kept *kept, int64_t size, double total, double uniform) {
    if (kept->row->patch_count) return pick_kept(weights, kept, size, total, uniform, 1);
    return pick_kept(weights, kept, size, total, uniform, 0);
}

/* The weights pass's bookkeeping of four ids from `at`, their values less the largest (`shifted`) and the exps
 * of those: the ids min-p keeps (at or above `edge`) weigh their exp, the others 0; the weights stored (or,
 * where every id is kept but min-p's, only each block's sum: pick_blocks), summed and the kept ones counted,
 * and under top-p (mass not NULL) the weights added to their buckets' sums (those past the row's end weigh 0,
 * in the last bucket). Called in id order, so every sum runs as it would one id after another by four lanes. */
typedef struct {
    double *weights; /* NULL: the weights are not kept, each block's sum is (blocks) */
    double *blocks;
    double *mass;
    int64_t size;
    double edge;
    Bucketing by;
    lanes sum;
    lanes block; /* the sums by lane of the block's ids so far */
    masks kept;  /* -1 for each id kept (past the end: -inf, never kept by a min-p) */
} Weighing;

static inline void weigh(Weighing *weighing, int64_t at, lanes shifted, lanes exps) {
    masks keep = shifted >= weighing->edge;
    lanes w = only(keep, exps);
    if (weighing->weights) {
        store_upto(weighing->weights, at, weighing->size, w);
    } else {
        weighing->block += w; /* pick's sum of the block, lane by lane in id order */
        if ((at + 4) % BLOCK == 0 || at + 4 >= weighing->size) {
            lanes b = weighing->block;
            weighing->blocks[at / BLOCK] = (b[0] + b[1]) + (b[2] + b[3]);
            weighing->block = (lanes){0.0, 0.0, 0.0, 0.0};
        }
    }
    weighing->sum += w;
    weighing->kept += keep;
    if (!weighing->mass) return;
    const double top = weighing->by.top;
    const lanes tops = {top, top, top, top};
    lanes product = shifted * weighing->by.scale; /* bucket_of's */
    masks under = product < tops;
    quads bucket = __builtin_convertvector((lanes)(((masks)product & under) | ((masks)tops & ~under)), quads);
    for (int j = 0; j < 4; j++) weighing->mass[bucket[j]] += w[j];
}

/* The patched ids among the `count` sets of four from `at`: their values less the largest in `shifted`, from
 * their patches; `patch`, the first patch not yet passed, moved past them and `next` to its id (INT64_MAX
 * past the last). Apart from the loops: most sets hold no patched id. */
__attribute__((noinline)) static void patch_lanes(const Row *row, int64_t at, int count, double largest,
                                                  int64_t *patch, int64_t *next, lanes *shifted) {
    for (; patch_id(row, *patch) < at + 4 * count; ++*patch) {
        int64_t k = row->patched[*patch] - at;
        shifted[k / 4][k % 4] = row->patches[*patch] / row->temperature - largest;
    }
    *next = patch_id(row, *patch);
}

/* The `count` sets of four ids' values from `at` less the largest, as the draw weighs them (the patched ones'
 * from their patches: patch_lanes), and their exps side by side (none waits on another). */
static inline void chunk_exps(const Row *row, int64_t at, int count, double largest, int64_t *patch,
                              int64_t *next, lanes *shifted, lanes *exps) {
#pragma GCC unroll 4
    for (int k = 0; k < count; k++) shifted[k] = values_at(row, at + 4 * k) - largest;
    if (*next < at + 4 * count) patch_lanes(row, at, count, largest, patch, next, shifted);
    exps_neg(count, shifted, exps);
}

/* The weights of the ids of the block from `start` (a multiple of BLOCK) into `out`, computed again as the
 * weights pass computed them (the same sets of four, the same exps: the same bits). */
static void block_weights(const Row *row, int64_t start, double largest, double edge, double *out) {
    int64_t size = row->size, end = start + BLOCK < size ? start + BLOCK : size, next, i = start;
    int64_t patch = first_patch(row, start, &next);
    for (; i < end && i + 4 * CHAINS <= size; i += 4 * CHAINS) {
        lanes shifted[CHAINS], exps[CHAINS];
        chunk_exps(row, i, CHAINS, largest, &patch, &next, shifted, exps);
        for (int k = 0; k < CHAINS; k++)
            store_upto(out, i + 4 * k - start, end - start, only(shifted[k] >= edge, exps[k]));
    }
    for (; i < end; i += 4) {
        lanes shifted, exps;
        chunk_exps(row, i, 1, largest, &patch, &next, &shifted, &exps);
        store_upto(out, i - start, end - start, only(shifted >= edge, exps));
    }
}

/* pick over every id's weight (none kept out but by min-p) from the sums of its blocks (`blocks`, the weights
 * pass's), the block where the pick falls weighed again: the same running sums, so the same id. */
static int64_t pick_blocks(const Row *row, const double *blocks, double largest, double edge, double total,
                           double uniform) {
    int64_t size = row->size, count = (size + BLOCK - 1) / BLOCK;
    double target = uniform * total, running = 0.0, w[BLOCK];
    for (int64_t b = 0; b < count; b++) {
        if (running + blocks[b] > target) {
            block_weights(row, b * BLOCK, largest, edge, w);
            return walk_block(w, b * BLOCK, (b + 1) * BLOCK < size ? (b + 1) * BLOCK : size, running, target);
        }
        running += blocks[b];
    }
    for (int64_t b = count - 1; b >= 0; b--) {
        if (blocks[b] <= 0.0) continue;
        block_weights(row, b * BLOCK, largest, edge, w);
        for (int64_t i = (b + 1) * BLOCK < size ? (b + 1) * BLOCK - 1 : size - 1; i >= b * BLOCK; i--)
            if (w[i - b * BLOCK] > 0.0) return i;
    }
    return -1;
}

/* A row's parts: a row of SPLIT_FROM ids or more is read in two, [0, split) and [split, size), split at a
 * block's edge near its middle; a shorter one in one. Each part's extremes and weights are its own, its sums
 * by four lanes in id order, and the parts' are added part by part (draw_row, whole_draw_scores): the same
 * bits whichever thread runs a part. */
static int64_t split_at(int64_t size) { return size < SPLIT_FROM ? size : size / 2 / BLOCK * BLOCK; }

/* split_at, for whole_draw.py. */
int64_t whole_draw_split_at(int64_t size) { return split_at(size); }

/* A task on one part (0 or 1) of a row, its context as the caller keeps it. */
typedef void (*PartTask)(void *context, int part);

#if HELPER
/* The helper: one thread, started by the first whole_draw_wake, that runs a row's second part while the calling
 * thread runs the first, between whole_draw_wake and whole_draw_rest (AWAKE_NS at most): a thread's wake-up
 * costs its waker some tens of microseconds on a virtual machine, so a caller wakes it once ahead of a step's
 * rows, not at each part. While awake it waits for parts (yielding its core to any thread that wants it), then
 * sleeps. A part is posted (its task and context, then state POSTED); whichever thread claims it first
 * (POSTED -> CLAIMED) runs it, so that a caller never waits on a helper that is late: it takes the part back
 * itself. One caller at a time holds the helper (`busy`); another runs both parts itself. It runs off the
 * CPU of the thread that last woke it (keep_away). A forked child starts its own. */
enum { IDLE, POSTED, CLAIMED, DONE };
static struct {
    pthread_mutex_t lock;
    pthread_cond_t wake;
    atomic_int busy, state, enabled;
    atomic_llong until;  /* CLOCK_MONOTONIC, ns: the helper waits for parts until then */
    atomic_llong helped; /* parts the helper has run */
    PartTask task;
    void *context;
    int started, sleeping, away_from; /* away_from: the CPU the helper may not run on (the caller's), or -1 */
    pthread_t thread;
} helper = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, IDLE, 0, 0, 0, NULL, NULL, 0, 0, -1, 0};

static inline void relax(void) {
#if defined(__x86_64__)
    _mm_pause();
#endif
}

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static int awake(void) { return now_ns() < atomic_load(&helper.until); }

static void *helper_main(void *unused) {
    (void)unused;
    for (;;) {
        while (atomic_load_explicit(&helper.state, memory_order_acquire) != POSTED) {
            if (awake()) {
                sched_yield();
                continue;
            }
            pthread_mutex_lock(&helper.lock);
            helper.sleeping = 1;
            while (!awake()) pthread_cond_wait(&helper.wake, &helper.lock);
            helper.sleeping = 0;
            pthread_mutex_unlock(&helper.lock);
        }
        int posted = POSTED;
        if (atomic_compare_exchange_strong(&helper.state, &posted, CLAIMED)) {
            helper.task(helper.context, 1);
            atomic_fetch_add(&helper.helped, 1);
            atomic_store_explicit(&helper.state, DONE, memory_order_release);
        }
    }
    return NULL;
}

/* In a forked child: no helper thread came with it, and no caller holds one. */
static void helper_forked(void) {
    pthread_mutex_init(&helper.lock, NULL);
    pthread_cond_init(&helper.wake, NULL);
    helper.started = helper.sleeping = 0;
    atomic_store(&helper.state, IDLE);
    atomic_store(&helper.busy, 0);
    atomic_store(&helper.until, 0);
    atomic_store(&helper.helped, 0);
}

/* Under helper.lock. */
static int helper_start(void) {
    static int registered = 0;
    if (!registered) registered = !pthread_atfork(NULL, NULL, helper_forked);
    pthread_t thread;
    pthread_attr_t attributes;
    if (!registered || pthread_attr_init(&attributes)) return 0;
    pthread_attr_setdetachstate(&attributes, PTHREAD_CREATE_DETACHED);
    helper.started = !pthread_create(&thread, &attributes, helper_main, NULL);
    pthread_attr_destroy(&attributes);
    helper.thread = thread;
    helper.away_from = -1;
    return helper.started;
}

/* Under helper.lock: the helper may run on any CPU the caller may but the one the caller is on (where it has
 * others), so that a scheduler never wakes it there to share the caller's core. */
static void keep_away(void) {
#if defined(__linux__)
    int cpu = sched_getcpu();
    cpu_set_t allowed;
    if (cpu < 0 || cpu == helper.away_from || sched_getaffinity(0, sizeof allowed, &allowed)) return;
    CPU_CLR(cpu, &allowed);
    if (CPU_COUNT(&allowed) && !pthread_setaffinity_np(helper.thread, sizeof allowed, &allowed)) helper.away_from = cpu;
#endif
}

/* Parts 0 and 1 of `task`, the second lent to the helper where it is awake and free; 0 where it is not (the
 * caller runs both). */
static int lend(PartTask task, void *context) {
    if (!atomic_load(&helper.enabled) || !awake() || atomic_exchange(&helper.busy, 1)) return 0;
    helper.task = task;
    helper.context = context;
    atomic_store_explicit(&helper.state, POSTED, memory_order_release);
    task(context, 0);
    int posted = POSTED;
    if (atomic_compare_exchange_strong(&helper.state, &posted, CLAIMED))
        task(context, 1); /* not claimed yet: taken back */
    else
        while (atomic_load_explicit(&helper.state, memory_order_acquire) != DONE) relax();
    atomic_store(&helper.state, IDLE);
    atomic_store_explicit(&helper.busy, 0, memory_order_release);
    return 1;
}
#endif

/* Wakes the helper thread (started at the first call) ahead of a step's long rows: it takes their second
 * parts until whole_draw_rest, AWAKE_NS at most. */
void whole_draw_wake(void) {
#if HELPER
    if (!atomic_load(&helper.enabled)) return;
    pthread_mutex_lock(&helper.lock);
    if (helper.started || helper_start()) {
        keep_away();
        atomic_store(&helper.until, now_ns() + AWAKE_NS);
        if (helper.sleeping) pthread_cond_signal(&helper.wake);
    }
    pthread_mutex_unlock(&helper.lock);
#endif
}

/* The helper takes no more parts and sleeps once the one it runs, if any, is done. */
void whole_draw_rest(void) {
#if HELPER
    atomic_store(&helper.until, 0);
#endif
}

/* How many parts the helper thread has run in this process. */
int64_t whole_draw_helped(void) {
#if HELPER
    return atomic_load(&helper.helped);
#else
    return 0;
#endif
}

/* Whether a row's second part may go to the helper thread (1) or not (0): whole_draw.py's DRAW_THREADS. */
void whole_draw_share(int share) {
#if HELPER
    atomic_store(&helper.enabled, share);
#else
    (void)share;
#endif
}

/* Runs `parts` (1 or 2) parts of `task`: the second on the helper where `share` and it can be had. */
static void run_parts(PartTask task, void *context, int parts, int share) {
#if HELPER
    if (parts == 2 && share && lend(task, context)) return;
#else
    (void)share;
#endif
    for (int part = 0; part < parts; part++) task(context, part);
}

/* A row's parts as draw_row reads them: their bounds, each part's extremes as read, and each part's weighing
 * (part 1 with buckets of its own, `mass`). */
typedef struct {
    const Row *row;
    int64_t bounds[3];
    double high[2], low[2];
    Weighing weighing[2];
    double largest;
    double mass[BUCKETS];
} Parts;

/* extremes of a part: the ids between patches from the row, the patched ones from their patches. */
static void part_extremes(void *context, int part) {
    Parts *parts = context;
    const Row *row = parts->row;
    int64_t start = parts->bounds[part], end = parts->bounds[part + 1], next;
    double high = -INFINITY, low = INFINITY;
    for (int64_t p = first_patch(row, start, &next); p < row->patch_count && row->patched[p] < end; p++) {
        extremes_between(row, start, row->patched[p], &high, &low);
        double v = row->patches[p];
        high = v > high ? v : high;
        low = v < low && v > -INFINITY ? v : low;
        start = row->patched[p] + 1;
    }
    extremes_between(row, start, end, &high, &low);
    parts->high[part] = high;
    parts->low[part] = low;
}

/* The weights pass over a part: its ids' weights (and block sums, and bucket sums) by its own Weighing. */
static void part_weights(void *context, int part) {
    Parts *parts = context;
    const Row *row = parts->row;
    Weighing weighing = parts->weighing[part]; /* a local copy: its sums stay in registers */
    double largest = parts->largest;
    int64_t i = parts->bounds[part], end = parts->bounds[part + 1], next, patch = first_patch(row, i, &next);
    for (; i + 4 * CHAINS <= end; i += 4 * CHAINS) {
        lanes shifted[CHAINS], exps[CHAINS];
        chunk_exps(row, i, CHAINS, largest, &patch, &next, shifted, exps);
#pragma GCC unroll 4
        for (int k = 0; k < CHAINS; k++) weigh(&weighing, i + 4 * k, shifted[k], exps[k]);
    }
    for (; i < end; i += 4) {
        lanes shifted, exps;
        chunk_exps(row, i, 1, largest, &patch, &next, &shifted, &exps);
        weigh(&weighing, i, shifted, exps);
    }
    parts->weighing[part] = weighing;
}

/* One row's id, or -1 where host_draw would take min-p's few ids (at most size / FEW kept) or every id is
 * -inf; -2 where memory ran out. Three passes over the row: its largest and lowest values; each id's weight
 * (and, under top-p, the buckets' sums); the pick's, which stops at its block. Under top-p, between the
 * second and the third, the crossing bucket's ids (a pass that compares values and sorts the few it finds).
 * The first two by parts (split_at), the second part on the helper thread where `share`. */
static int64_t draw_row(const Row *row, double min_p, double top_p, double uniform, double *restrict weights,
                        int32_t *restrict members, int share) {
    int64_t size = row->size, split = split_at(size);
    Parts parts = {.row = row, .bounds = {0, split, size}};
    int count_parts = split < size ? 2 : 1;
    run_parts(part_extremes, &parts, count_parts, share);
    double high = parts.high[0], low = parts.low[0]; /* as read */
    if (count_parts == 2) {
        high = fmax(high, parts.high[1]);
        low = fmin(low, parts.low[1]);
    }
    low = low == INFINITY ? -INFINITY : low;
    /* the division keeps the order: the largest and lowest of the divided values */
    double largest = row->f32 ? high / row->temperature : high, lowest = row->f32 ? low / row->temperature : low;
    if (largest == -INFINITY) return -1;
    double edge = min_p > 0.0 ? log(min_p) : -INFINITY;
    int64_t count = bucket_count(size);
    double low_edge = lowest - largest > -64.0 ? lowest - largest : -64.0; /* lower: the last bucket */
    Bucketing by = {largest, low_edge < 0.0 ? (double)(count - 1) / low_edge : 0.0, (double)(count - 1)};
    double mass[BUCKETS];
    int nucleus = top_p < 1.0; /* else the weights are not kept: their blocks' sums are (in `weights`) */
    for (int part = 0; part < count_parts; part++) {
        double *sums = part ? parts.mass : mass;
        if (nucleus) memset(sums, 0, sizeof(double) * count);
        parts.weighing[part] = (Weighing){nucleus ? weights : NULL, weights, nucleus ? sums : NULL, size, edge, by,
                                          {0.0}, {0.0}, {0}};
    }
    parts.largest = largest;
    run_parts(part_weights, &parts, count_parts, share);
    lanes sum = parts.weighing[0].sum;
    masks kept_lanes = parts.weighing[0].kept;
    if (count_parts == 2) { /* the second part's sums after the first's */
        sum += parts.weighing[1].sum;
        kept_lanes += parts.weighing[1].kept;
        if (nucleus)
            for (int64_t b = 0; b < count; b++) mass[b] += parts.mass[b];
    }
    int64_t kept = -((kept_lanes[0] + kept_lanes[1]) + (kept_lanes[2] + kept_lanes[3]));
    if (edge > -INFINITY && kept <= size / FEW) return -1;
    double total = (sum[0] + sum[1]) + (sum[2] + sum[3]);
    if (!nucleus) return pick_blocks(row, weights, largest, edge, total, uniform);
    double before, target, kept_from;
    int32_t crossing = crossing_bucket(mass, count, top_p, &before, &target);
    total = take_crossing(row, &by, low, high, crossing, before, target, weights, members, &kept_from);
    if (total < 0.0) return (int64_t)total;
    float kept_from32 = row->f32 ? float_at_or_above(kept_from) : 0.0f; /* a float32 row's values bound it */
    return pick(weights, &(Kept){row, kept_from, kept_from32}, size, total, uniform);
}

/* Each of n rows' id (ids, n int64): rows of `size` float64 values `stride` apart, each with its min-p,
 * top-p and uniform number; `weights` a buffer of `size` float64, `members` of `size` int32; `share`: whether
 * a row's second part may go to the helper thread (not where the caller shares rows out between threads).
 * -1 for a row host_draw draws otherwise; -2 where memory ran out. */
void whole_draws(const double *rows, int64_t n, int64_t size, int64_t stride, const double *min_p,
                 const double *top_p, const double *uniform, double *weights, int32_t *members, int64_t *ids,
                 int share) {
    for (int64_t r = 0; r < n; r++) {
        Row row = {NULL, rows + r * stride, 1.0, size};
        ids[r] = draw_row(&row, min_p[r], top_p[r], uniform[r], weights, members, share);
    }
}

/* The same of float32 logits (each of the n rows where its pointer says), each row divided by its
 * temperature (> 0) as it is read: the ids whole_draws gives those rows once sampling.processed_row has
 * divided them (float64 values of the same division). */
void whole_draws_logits(const float *const *rows, int64_t n, int64_t size, const double *temperature,
                        const double *min_p, const double *top_p, const double *uniform, double *weights,
                        int32_t *members, int64_t *ids, int share) {
    for (int64_t r = 0; r < n; r++) {
        Row row = {rows[r], NULL, temperature[r], size};
        ids[r] = draw_row(&row, min_p[r], top_p[r], uniform[r], weights, members, share);
    }
}

/* One row's id as whole_draws_logits gives it (of float32 logits, divided by `temperature` as read), its
 * arguments as they are: a single row's call costs its caller no arrays. */
int64_t whole_draw_logits(const float *logits, int64_t size, double temperature, double min_p, double top_p,
                          double uniform, double *weights, int32_t *members) {
    Row row = {logits, NULL, temperature, size};
    return draw_row(&row, min_p, top_p, uniform, weights, members, 1);
}

/* The same of float64 values (already divided), as whole_draws gives it. */
int64_t whole_draw_values(const double *values, int64_t size, double min_p, double top_p, double uniform,
                          double *weights, int32_t *members) {
    Row row = {NULL, values, 1.0, size};
    return draw_row(&row, min_p, top_p, uniform, weights, members, 1);
}

/* qsort's order of int32 ids. */
static int ascending(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* Copies the `count` ids at `ids` into `patched` from `at`: the next place, or -1 where one is outside the row. */
static int64_t gather_ids(int32_t *patched, int64_t at, const int64_t *ids, int64_t count, int64_t size) {
    for (int64_t j = 0; j < count; j++) {
        if (ids[j] < 0 || ids[j] >= size) return -1;
        patched[at++] = (int32_t)ids[j];
    }
    return at;
}

/* One float32 row's id as whole_draw_logits gives it, after what sampling.processed_row changes in its float64
 * copy, in its order: the repetition `penalty` on the `seen_count` ids `seen` (each logit divided by it where
 * positive, else multiplied), OpenAI's penalties on the `occurred_count` ids `occurred` (each less `frequency`
 * times its count in `counts`, rounded, plus `presence`), then each of the `bias_count` biases added in turn
 * (`bias_values` to `bias_ids`; a ban's is -inf), every value divided by the temperature. The id
 * whole_draw_values gives that copy, without it: the changed ids' values are patched in as the row is read.
 * seen and occurred hold each id once; a bias may repeat an id. -1 also where an id is outside the row; -2
 * where memory ran out. */
int64_t whole_draw_processed(const float *logits, int64_t size, double temperature, double min_p, double top_p,
                             double uniform, const int64_t *seen, int64_t seen_count, double penalty,
                             const int64_t *occurred, const int64_t *counts, int64_t occurred_count,
                             double presence, double frequency, const int64_t *bias_ids, const double *bias_values,
                             int64_t bias_count, double *weights, int32_t *members) {
    int64_t total = seen_count + occurred_count + bias_count, kept = 0;
    char *room = malloc((sizeof(int32_t) + sizeof(double)) * (total ? total : 1));
    if (!room) return -2;
    double *patches = (double *)room;
    int32_t *patched = (int32_t *)(patches + total);
    int64_t at = gather_ids(patched, 0, seen, seen_count, size);
    at = at < 0 ? at : gather_ids(patched, at, occurred, occurred_count, size);
    at = at < 0 ? at : gather_ids(patched, at, bias_ids, bias_count, size);
    if (at < 0) {
        free(room);
        return -1;
    }
    qsort(patched, total, sizeof(int32_t), ascending);
    for (int64_t j = 0; j < total; j++) /* each id once */
        if (!kept || patched[kept - 1] != patched[j]) patched[kept++] = patched[j];
    Row row = {logits, NULL, temperature, size, patched, patches, kept};
    for (int64_t j = 0; j < kept; j++) patches[j] = logits[patched[j]];
    for (int64_t j = 0; j < seen_count; j++) { /* penalize_repetition's */
        double *x = &patches[patch_of(&row, seen[j])];
        *x = *x > 0 ? *x / penalty : *x * penalty;
    }
    for (int64_t j = 0; j < occurred_count; j++) { /* penalize_occurrences': the product rounded, as numpy's */
        volatile double product = frequency * (double)counts[j];
        patches[patch_of(&row, occurred[j])] -= product + presence;
    }
    for (int64_t j = 0; j < bias_count; j++) patches[patch_of(&row, bias_ids[j])] += bias_values[j];
    int64_t id = draw_row(&row, min_p, top_p, uniform, weights, members, 1);
    free(room);
    return id;
}

/* Keeps the `count` largest values met so far (ids ascending as met), descending, the lower id first on
 * ties: a value joins only above the last kept one, after those equal to it. Returns how many are kept. */
static int64_t keep_largest(int64_t kept, int64_t count, int64_t id, float value, int64_t *ids, float *values) {
    int64_t at = kept < count ? kept : count - 1;
    while (at > 0 && values[at - 1] < value) {
        if (at < count) {
            ids[at] = ids[at - 1];
            values[at] = values[at - 1];
        }
        at--;
    }
    ids[at] = id;
    values[at] = value;
    return kept < count ? kept + 1 : count;
}

static int is_banned(int64_t id, const int64_t *banned, int64_t banned_count) {
    for (int64_t j = 0; j < banned_count; j++)
        if (banned[j] == id) return 1;
    return 0;
}

/* The `count` largest values of float32 logits (size,) but those of `banned` (banned_count ids) and -inf,
 * descending, the lower id first on ties, into `values` with their ids into `ids`: eight values at once
 * against the least kept. Returns how many are kept (fewer than `count` where fewer are above -inf). */
static int64_t largest_values(const float *row, int64_t size, const int64_t *banned, int64_t banned_count,
                              int64_t count, int64_t *ids, float *values) {
    int64_t kept = 0, i = 0;
    float least = -INFINITY;
    for (; i + 8 <= size; i += 8) {
        octets v;
        memcpy(&v, row + i, sizeof v);
        if (!any_set(v > least)) continue;
        for (int j = 0; j < 8; j++)
            if (v[j] > least && !is_banned(i + j, banned, banned_count)) {
                kept = keep_largest(kept, count, i + j, v[j], ids, values);
                least = kept == count ? values[count - 1] : -INFINITY;
            }
    }
    for (; i < size; i++)
        if (row[i] > least && !is_banned(i, banned, banned_count)) {
            kept = keep_largest(kept, count, i, row[i], ids, values);
            least = kept == count ? values[count - 1] : -INFINITY;
        }
    return kept;
}

/* The ids (ascending) of float32 logits (size,) at least as large as their `count`-th largest value but those
 * of `banned` (banned_count ids), ties kept, into `ids` (room for `room`): how many, or -1 where more than
 * `room` are or fewer than `count` values but the banned are above -inf. Two passes: the `count` largest
 * values (largest_values, into `values` and `order`, `count` each), then every id at or above the last of
 * them. */
static int64_t likeliest_but(const float *row, int64_t size, const int64_t *banned, int64_t banned_count,
                             int64_t count, int64_t room, int64_t *ids, float *values, int64_t *order) {
    if (largest_values(row, size, banned, banned_count, count, order, values) < count) return -1;
    float least = values[count - 1];
    int64_t found = 0, i = 0;
    const octets edges = {least, least, least, least, least, least, least, least};
    for (; i + 8 <= size; i += 8) {
        octets v;
        memcpy(&v, row + i, sizeof v);
        if (!any_set(v >= edges)) continue;
        for (int j = 0; j < 8; j++)
            if (v[j] >= least && !is_banned(i + j, banned, banned_count)) {
                if (found == room) return -1;
                ids[found++] = i + j;
            }
    }
    for (; i < size; i++)
        if (row[i] >= least && !is_banned(i, banned, banned_count)) {
            if (found == room) return -1;
            ids[found++] = i;
        }
    return found;
}

/* likeliest_but, no id banned: the few ids likeliest.candidates takes. */
int64_t whole_draw_likeliest(const float *row, int64_t size, int64_t count, int64_t room, int64_t *ids,
                             float *values, int64_t *order) {
    return likeliest_but(row, size, NULL, 0, count, room, ids, values, order);
}

/* numpy's float64 sum of `n` values, bit for bit: its pairwise summation (one running sum under 8 values, eight
 * side by side to 128, and halves, each a multiple of 8, above). */
static double numpy_sum(const double *a, int64_t n) {
    if (n < 8) {
        double sum = 0.0;
        for (int64_t i = 0; i < n; i++) sum += a[i];
        return sum;
    }
    if (n <= 128) {
        double r[8];
        memcpy(r, a, sizeof r);
        int64_t i = 8;
        for (; i < n - n % 8; i += 8)
            for (int j = 0; j < 8; j++) r[j] += a[i + j];
        double sum = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for (; i < n; i++) sum += a[i];
        return sum;
    }
    int64_t half = n / 2;
    half -= half % 8;
    return numpy_sum(a, half) + numpy_sum(a + half, n - half);
}

/* A top-k draw of float32 logits (size,), each divided by `temperature` (> 0) as read, its `banned` ids
 * (banned_count, ascending) at -inf, compiled: host_draw.draw's pick over the few ids that decide it
 * (draw_among's: the same ids kept, in the same float64 arithmetic, numpy's pairwise sum and running sums,
 * exp_neg for numpy's exp), in likeliest_but's two passes over the row and none more. The id, or -1 where
 * draw_among would not pick from the few (more than `room` ids at least as large as the top_k-th largest, or
 * fewer than top_k above -inf). `ids` room for `room`, `values` and `order` for top_k; `scratch` for 4 * room
 * float64. */
int64_t whole_draw_top_k(const float *row, int64_t size, double temperature, double min_p, int64_t top_k,
                         double top_p, double uniform, const int64_t *banned, int64_t banned_count, int64_t room,
                         int64_t *ids, float *values, int64_t *order, double *scratch) {
    int64_t found = likeliest_but(row, size, banned, banned_count, top_k, room, ids, values, order);
    if (found < 0) return -1;
    double largest = (double)values[0] / temperature;
    double edge = (double)values[top_k - 1] / temperature - largest; /* the top_k-th largest, less the largest */
    if (min_p > 0.0 && log(min_p) > edge) edge = log(min_p);
    double *shifted = scratch, *weights = scratch + room;
    Member *ranked = (Member *)(scratch + 2 * room); /* 2 * room float64 */
    int64_t few = 0;
    for (int64_t j = 0; j < found; j++) { /* the kept ids, in id order, and their values less the largest */
        double value = (double)row[ids[j]] / temperature - largest;
        if (value >= edge) {
            shifted[few] = value;
            ids[few++] = ids[j];
        }
    }
    for (int64_t j = 0; j < few; j += 4) store_upto(weights, j, few, exp_neg(load_upto(shifted, j, few, -INFINITY)));
    if (top_p < 1.0) { /* kept_among: by value descending (the lower id first), those past p of the total weigh 0 */
        double target = top_p * numpy_sum(weights, few), running = 0.0;
        for (int64_t j = 0; j < few; j++) ranked[j] = (Member){shifted[j], j};
        qsort(ranked, few, sizeof(Member), descending);
        for (int64_t j = 0; j < few; j++) {
            double weight = weights[ranked[j].id];
            running += weight;
            if (running - weight >= target) weights[ranked[j].id] = 0.0;
        }
    }
    double total = 0.0; /* running_pick: the first id whose running sum passes uniform times the last */
    for (int64_t j = 0; j < few; j++) total += weights[j];
    int64_t picked = walk_block(weights, 0, few, 0.0, uniform * total);
    return picked < 0 ? -1 : ids[picked];
}

/* The sum of e^(value - largest) over float32 values [start, end) of `row`: CHAINS sets of four lanes side
 * by side, added into `sums` (the caller adds the lanes up in one order). */
static void add_exps(const float *row, int64_t start, int64_t end, double largest, lanes *sums) {
    Row read = {row, NULL, 1.0, end};
    int64_t i = start;
    for (; i + 4 * CHAINS <= end; i += 4 * CHAINS) {
        lanes shifted[CHAINS], exps[CHAINS];
#pragma GCC unroll 4
        for (int k = 0; k < CHAINS; k++) shifted[k] = raw_at(&read, i + 4 * k) - largest;
        exps_neg(CHAINS, shifted, exps);
#pragma GCC unroll 4
        for (int k = 0; k < CHAINS; k++) sums[k] += exps[k];
    }
    for (; i < end; i += 4) sums[0] += exp_neg(raw_at(&read, i) - largest); /* past `end`: -inf, weighs 0 */
}

/* A greedy row's sum of exps by parts (split_at): each part's ids not banned, the stretches between banned
 * ids, into its own sums. */
typedef struct {
    const float *row;
    int64_t bounds[3];
    const int64_t *banned;
    int64_t banned_count;
    double largest;
    lanes sums[2][CHAINS];
} Exps;

static void part_exps(void *context, int part) {
    Exps *exps = context;
    int64_t low = exps->bounds[part], high = exps->bounds[part + 1], start = 0;
    lanes sums[CHAINS] = {{0.0}};
    for (int64_t j = 0; j <= exps->banned_count; j++) { /* the stretches between banned ids, within the part */
        int64_t end = j < exps->banned_count ? exps->banned[j] : high;
        int64_t from = start > low ? start : low, to = end < high ? end : high;
        if (to > from) add_exps(exps->row, from, to, exps->largest, sums);
        start = end + 1;
    }
    memcpy(exps->sums[part], sums, sizeof sums);
}

/* A greedy row's log-probabilities, compiled (sampling.greedy_scored): of float32 logits (size,), the
 * `count` largest values' ids (descending, the lower id first on ties) and values into `ids` and `values`,
 * none of `banned` (banned_count ids, ascending) among them, and the sum over every id not banned of
 * e^(value - largest), largest the first of them, as log_softmax's float64 sum (the order of its additions
 * aside); kept_count is how many were kept (0: every id banned or -inf, and the sum 0). Two passes over the
 * row: largest_values's, then the exps by parts (part_exps; the second on the helper thread where `share`). */
double whole_draw_scores(const float *row, int64_t size, const int64_t *banned, int64_t banned_count,
                         int64_t count, int64_t *ids, float *values, int64_t *kept_count, int share) {
    int64_t kept = largest_values(row, size, banned, banned_count, count, ids, values);
    *kept_count = kept;
    if (!kept) return 0.0;
    int64_t split = split_at(size);
    Exps exps = {row, {0, split, size}, banned, banned_count, values[0], {{{0.0}}}};
    run_parts(part_exps, &exps, split < size ? 2 : 1, share);
    lanes sum = exps.sums[0][0];
    for (int part = 0; part < 2; part++)
        for (int k = !part; k < CHAINS; k++) sum += exps.sums[part][k];
    return (sum[0] + sum[1]) + (sum[2] + sum[3]);
}

#if defined(__x86_64__) && defined(__clang__)
#pragma clang attribute pop
#endif
