/* metrics.h — a small thread-safe Prometheus registry (counters, gauges, histograms) and its
 * text exposition format 0.0.4. Used by the router and baton-worker (which publishes libbaton's
 * engine counters through it). */
#ifndef BATON_COMMON_METRICS_H
#define BATON_COMMON_METRICS_H

#include <stddef.h>

#include "common/buf.h"

/*
 * A registry owns families; a family owns its children (one per distinct label-value tuple).
 * Children are created on first use and live as long as the registry, so hot paths look a child
 * up once (baton_metric_child) and then update it lock-free with atomics from any thread.
 * Label values are copied. Names must match [a-zA-Z_:][a-zA-Z0-9_:]*; label values are escaped
 * on output. Rendering takes each family's lock briefly; updates never block on it.
 *
 * Families with the same name cannot be registered twice (the second call returns NULL).
 */

typedef struct baton_metrics_s baton_metrics_t;
typedef struct baton_metric_family_s baton_metric_family_t;
typedef struct baton_metric_child_s baton_metric_child_t;

typedef enum {
    BATON_METRIC_COUNTER,
    BATON_METRIC_GAUGE,
    BATON_METRIC_HISTOGRAM,
} baton_metric_type_t;

baton_metrics_t *baton_metrics_create(void);
void baton_metrics_destroy(baton_metrics_t *reg);

/* label_names may be NULL when n_labels is 0. Returns NULL on a bad name or duplicate. */
baton_metric_family_t *baton_metrics_counter(baton_metrics_t *reg, const char *name,
                                             const char *help, size_t n_labels,
                                             const char *const *label_names);
baton_metric_family_t *baton_metrics_gauge(baton_metrics_t *reg, const char *name, const char *help,
                                           size_t n_labels, const char *const *label_names);
/* buckets: strictly increasing upper bounds (the +Inf bucket is implicit); copied. */
baton_metric_family_t *baton_metrics_histogram(baton_metrics_t *reg, const char *name,
                                               const char *help, size_t n_labels,
                                               const char *const *label_names,
                                               const double *buckets, size_t n_buckets);

/* The child for these label values (n_labels of them; NULL when the family has no labels).
 * Created on first use; the pointer stays valid until the registry is destroyed. */
baton_metric_child_t *baton_metric_child(baton_metric_family_t *fam,
                                         const char *const *label_values);

/* Removes a child (e.g. a worker that was deleted) so it is no longer rendered. The child's
 * memory is kept until the registry is destroyed, so stale pointers stay safe to update. */
void baton_metric_child_remove(baton_metric_family_t *fam, const char *const *label_values);

/* Updates; lock-free. counter_add ignores negative values. Every update takes a NULL child and
 * does nothing, and baton_metric_child returns NULL for a NULL family, so a metric whose
 * registration failed needs no check at its call sites. */
void baton_counter_add(baton_metric_child_t *c, double v);
void baton_gauge_set(baton_metric_child_t *c, double v);
void baton_gauge_add(baton_metric_child_t *c, double v); /* v may be negative */
void baton_histogram_observe(baton_metric_child_t *c, double v);
double baton_metric_value(const baton_metric_child_t *c); /* counter/gauge value; histogram sum */

/* Convenience: child lookup + update in one call (takes the family lock for the lookup). */
void baton_counter_inc_labels(baton_metric_family_t *fam, const char *const *label_values);

/* Appends the whole registry in text format 0.0.4 (# HELP, # TYPE, samples; histograms with
 * _bucket{le=...}, _sum, _count). Returns 0 or BATON_ENOMEM. */
int baton_metrics_render(baton_metrics_t *reg, baton_buf_t *out);

/* Default latency buckets in seconds: 0.0005 .. 60. */
extern const double baton_latency_buckets[];
extern const size_t baton_latency_buckets_n;

#endif
