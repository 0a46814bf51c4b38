/* stats.c — percentiles, summaries and the growable sample array of baton-bench. */
#include "stats.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "baton/error.h"

double bb_percentile_sorted(const double *sorted, size_t n, double p)
{
    if (n == 1 || p <= 0)
        return sorted[0];
    if (p >= 100)
        return sorted[n - 1];
    double pos = p / 100.0 * (double)(n - 1);
    size_t lo = (size_t)floor(pos);
    size_t hi = lo + 1 < n ? lo + 1 : lo;
    double frac = pos - (double)lo;
    return sorted[lo] + (sorted[hi] - sorted[lo]) * frac;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

void bb_summarize(double *v, size_t n, bb_summary_t *out)
{
    memset(out, 0, sizeof(*out));
    if (n == 0)
        return;
    qsort(v, n, sizeof(*v), cmp_double);
    double sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += v[i];
    double mean = sum / (double)n;
    double sq = 0;
    for (size_t i = 0; i < n; i++)
        sq += (v[i] - mean) * (v[i] - mean);
    out->n = n;
    out->mean = mean;
    out->std = sqrt(sq / (double)n);
    out->min = v[0];
    out->max = v[n - 1];
    out->p50 = bb_percentile_sorted(v, n, 50);
    out->p90 = bb_percentile_sorted(v, n, 90);
    out->p99 = bb_percentile_sorted(v, n, 99);
}

int bb_vec_push(bb_vec_t *vec, double x)
{
    if (vec->n == vec->cap) {
        size_t cap = vec->cap ? vec->cap * 2 : 64;
        double *nv = realloc(vec->v, cap * sizeof(*nv));
        if (!nv)
            return BATON_ENOMEM;
        vec->v = nv;
        vec->cap = cap;
    }
    vec->v[vec->n++] = x;
    return 0;
}

void bb_vec_free(bb_vec_t *vec)
{
    free(vec->v);
    vec->v = NULL;
    vec->n = vec->cap = 0;
}
