/* metrics.c — Prometheus registry (counters, gauges, histograms) and text format 0.0.4. */
#include "common/metrics.h"

#include "baton/error.h"
#include "common/hash.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const double baton_latency_buckets[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                        0.25,   0.5,   1,      2.5,   5,    10,    30,   60};
const size_t baton_latency_buckets_n = sizeof(baton_latency_buckets) / sizeof(double);

struct baton_metric_child_s {
    baton_metric_family_t *fam;
    char **label_values;
    uint64_t hash;
    atomic_int removed;
    struct baton_metric_child_s *hnext; /* hash chain */
    struct baton_metric_child_s *next;  /* creation order, for stable output */
    /* Doubles are kept as their bit pattern so updates are lock-free compare-exchanges. */
    _Atomic uint64_t value_bits; /* counter/gauge value; histogram sum */
    _Atomic uint64_t counts[];   /* histogram: per-bucket (not cumulative), last is +Inf */
};

struct baton_metric_family_s {
    char *name;
    char *help;
    baton_metric_type_t type;
    size_t n_labels;
    char **label_names;
    double *buckets;
    size_t n_buckets;
    pthread_mutex_t lock; /* children table and list */
    baton_metric_child_t **table;
    size_t table_cap;
    size_t n_children;
    baton_metric_child_t *first;
    baton_metric_child_t *last;
    struct baton_metric_family_s *next;
};

struct baton_metrics_s {
    pthread_mutex_t lock; /* family list */
    baton_metric_family_t *first;
    baton_metric_family_t *last;
};

static uint64_t dbl_bits(double v)
{
    uint64_t u;
    memcpy(&u, &v, sizeof(u));
    return u;
}

static double bits_dbl(uint64_t u)
{
    double v;
    memcpy(&v, &u, sizeof(v));
    return v;
}

static void atomic_add_double(_Atomic uint64_t *slot, double v)
{
    uint64_t old = atomic_load_explicit(slot, memory_order_relaxed);
    for (;;) {
        uint64_t upd = dbl_bits(bits_dbl(old) + v);
        if (atomic_compare_exchange_weak_explicit(slot, &old, upd, memory_order_relaxed,
                                                  memory_order_relaxed))
            return;
    }
}

static int valid_metric_name(const char *s)
{
    if (s == NULL || *s == '\0')
        return 0;
    for (size_t i = 0; s[i]; i++) {
        char c = s[i];
        int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':' ||
                 (i > 0 && c >= '0' && c <= '9');
        if (!ok)
            return 0;
    }
    return 1;
}

static int valid_label_name(const char *s)
{
    if (s == NULL || *s == '\0' || strncmp(s, "__", 2) == 0) /* __ is reserved by Prometheus */
        return 0;
    for (size_t i = 0; s[i]; i++) {
        char c = s[i];
        int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
                 (i > 0 && c >= '0' && c <= '9');
        if (!ok)
            return 0;
    }
    return 1;
}

static void free_strv(char **v, size_t n)
{
    if (v == NULL)
        return;
    for (size_t i = 0; i < n; i++)
        free(v[i]);
    free(v);
}

static char **dup_strv(const char *const *v, size_t n)
{
    char **out = calloc(n ? n : 1, sizeof(char *));
    if (out == NULL)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        out[i] = strdup(v[i]);
        if (out[i] == NULL) {
            free_strv(out, n);
            return NULL;
        }
    }
    return out;
}

static uint64_t hash_values(const char *const *values, size_t n)
{
    uint64_t h = BATON_FNV1A64_INIT;
    for (size_t i = 0; i < n; i++) {
        h = baton_fnv1a64_add_str(h, values[i]);
        h = baton_fnv1a64_step(h, 0xff); /* separator: ("a","bc") and ("ab","c") differ */
    }
    return h;
}

baton_metrics_t *baton_metrics_create(void)
{
    baton_metrics_t *reg = calloc(1, sizeof(*reg));
    if (reg == NULL)
        return NULL;
    if (pthread_mutex_init(&reg->lock, NULL) != 0) {
        free(reg);
        return NULL;
    }
    return reg;
}

static void family_free(baton_metric_family_t *fam)
{
    baton_metric_child_t *c = fam->first;
    while (c != NULL) {
        baton_metric_child_t *next = c->next;
        free_strv(c->label_values, fam->n_labels);
        free(c);
        c = next;
    }
    free(fam->table);
    free_strv(fam->label_names, fam->n_labels);
    free(fam->buckets);
    free(fam->name);
    free(fam->help);
    pthread_mutex_destroy(&fam->lock);
    free(fam);
}

void baton_metrics_destroy(baton_metrics_t *reg)
{
    if (reg == NULL)
        return;
    baton_metric_family_t *f = reg->first;
    while (f != NULL) {
        baton_metric_family_t *next = f->next;
        family_free(f);
        f = next;
    }
    pthread_mutex_destroy(&reg->lock);
    free(reg);
}

/* Called with fam->lock held (or before the family is published). */
static baton_metric_child_t *child_create_locked(baton_metric_family_t *fam,
                                                 const char *const *values, uint64_t hash)
{
    size_t n_counts = fam->type == BATON_METRIC_HISTOGRAM ? fam->n_buckets + 1 : 0;
    if (fam->n_children + 1 > fam->table_cap / 2) {
        size_t cap = fam->table_cap ? fam->table_cap * 2 : 16;
        baton_metric_child_t **table = calloc(cap, sizeof(*table));
        if (table == NULL)
            return NULL;
        for (baton_metric_child_t *c = fam->first; c != NULL; c = c->next) {
            size_t slot = c->hash & (cap - 1);
            c->hnext = table[slot];
            table[slot] = c;
        }
        free(fam->table);
        fam->table = table;
        fam->table_cap = cap;
    }
    baton_metric_child_t *c = calloc(1, sizeof(*c) + n_counts * sizeof(c->counts[0]));
    if (c == NULL)
        return NULL;
    c->label_values = dup_strv(values, fam->n_labels);
    if (c->label_values == NULL) {
        free(c);
        return NULL;
    }
    c->fam = fam;
    c->hash = hash;
    atomic_init(&c->removed, 0);
    atomic_init(&c->value_bits, dbl_bits(0.0));
    for (size_t i = 0; i < n_counts; i++)
        atomic_init(&c->counts[i], 0);
    size_t slot = hash & (fam->table_cap - 1);
    c->hnext = fam->table[slot];
    fam->table[slot] = c;
    if (fam->last != NULL)
        fam->last->next = c;
    else
        fam->first = c;
    fam->last = c;
    fam->n_children++;
    return c;
}

static baton_metric_child_t *child_find_locked(baton_metric_family_t *fam,
                                               const char *const *values, uint64_t hash)
{
    if (fam->table_cap == 0)
        return NULL;
    for (baton_metric_child_t *c = fam->table[hash & (fam->table_cap - 1)]; c != NULL;
         c = c->hnext) {
        if (c->hash != hash)
            continue;
        size_t i = 0;
        while (i < fam->n_labels && strcmp(c->label_values[i], values[i]) == 0)
            i++;
        if (i == fam->n_labels)
            return c;
    }
    return NULL;
}

static baton_metric_family_t *family_register(baton_metrics_t *reg, const char *name,
                                              const char *help, baton_metric_type_t type,
                                              size_t n_labels, const char *const *label_names,
                                              const double *buckets, size_t n_buckets)
{
    if (reg == NULL || !valid_metric_name(name) || (n_labels > 0 && label_names == NULL))
        return NULL;
    for (size_t i = 0; i < n_labels; i++) {
        if (!valid_label_name(label_names[i]))
            return NULL;
        if (type == BATON_METRIC_HISTOGRAM && strcmp(label_names[i], "le") == 0)
            return NULL;
        for (size_t j = 0; j < i; j++)
            if (strcmp(label_names[i], label_names[j]) == 0)
                return NULL;
    }
    if (type == BATON_METRIC_HISTOGRAM) {
        if (n_buckets > 0 && buckets == NULL)
            return NULL;
        /* A trailing +Inf bound is the implicit one; accept and drop it. */
        if (n_buckets > 0 && isinf(buckets[n_buckets - 1]) && buckets[n_buckets - 1] > 0)
            n_buckets--;
        for (size_t i = 0; i < n_buckets; i++) {
            if (isnan(buckets[i]) || isinf(buckets[i]))
                return NULL;
            if (i > 0 && !(buckets[i] > buckets[i - 1]))
                return NULL;
        }
    }

    baton_metric_family_t *fam = calloc(1, sizeof(*fam));
    if (fam == NULL)
        return NULL;
    if (pthread_mutex_init(&fam->lock, NULL) != 0) {
        free(fam);
        return NULL;
    }
    fam->type = type;
    fam->n_labels = n_labels;
    fam->name = strdup(name);
    fam->help = strdup(help ? help : "");
    fam->label_names = dup_strv(label_names, n_labels);
    if (type == BATON_METRIC_HISTOGRAM) {
        fam->n_buckets = n_buckets;
        fam->buckets = malloc((n_buckets ? n_buckets : 1) * sizeof(double));
        if (fam->buckets != NULL && n_buckets > 0)
            memcpy(fam->buckets, buckets, n_buckets * sizeof(double));
    }
    if (fam->name == NULL || fam->help == NULL || fam->label_names == NULL ||
        (type == BATON_METRIC_HISTOGRAM && fam->buckets == NULL)) {
        family_free(fam);
        return NULL;
    }
    /* A family without labels has exactly one series; it exists (at 0) from the start, as in
     * the official client libraries. */
    if (n_labels == 0 && child_create_locked(fam, NULL, hash_values(NULL, 0)) == NULL) {
        family_free(fam);
        return NULL;
    }

    pthread_mutex_lock(&reg->lock);
    for (baton_metric_family_t *f = reg->first; f != NULL; f = f->next) {
        if (strcmp(f->name, name) == 0) {
            pthread_mutex_unlock(&reg->lock);
            family_free(fam);
            return NULL;
        }
    }
    if (reg->last != NULL)
        reg->last->next = fam;
    else
        reg->first = fam;
    reg->last = fam;
    pthread_mutex_unlock(&reg->lock);
    return fam;
}

baton_metric_family_t *baton_metrics_counter(baton_metrics_t *reg, const char *name,
                                             const char *help, size_t n_labels,
                                             const char *const *label_names)
{
    return family_register(reg, name, help, BATON_METRIC_COUNTER, n_labels, label_names, NULL, 0);
}

baton_metric_family_t *baton_metrics_gauge(baton_metrics_t *reg, const char *name, const char *help,
                                           size_t n_labels, const char *const *label_names)
{
    return family_register(reg, name, help, BATON_METRIC_GAUGE, n_labels, label_names, NULL, 0);
}

baton_metric_family_t *baton_metrics_histogram(baton_metrics_t *reg, const char *name,
                                               const char *help, size_t n_labels,
                                               const char *const *label_names,
                                               const double *buckets, size_t n_buckets)
{
    return family_register(reg, name, help, BATON_METRIC_HISTOGRAM, n_labels, label_names, buckets,
                           n_buckets);
}

baton_metric_child_t *baton_metric_child(baton_metric_family_t *fam,
                                         const char *const *label_values)
{
    if (fam == NULL || (fam->n_labels > 0 && label_values == NULL))
        return NULL;
    for (size_t i = 0; i < fam->n_labels; i++)
        if (label_values[i] == NULL)
            return NULL;
    uint64_t h = hash_values(label_values, fam->n_labels);
    pthread_mutex_lock(&fam->lock);
    baton_metric_child_t *c = child_find_locked(fam, label_values, h);
    if (c == NULL)
        c = child_create_locked(fam, label_values, h);
    else
        atomic_store(&c->removed, 0); /* a removed series comes back with its old value */
    pthread_mutex_unlock(&fam->lock);
    return c;
}

void baton_metric_child_remove(baton_metric_family_t *fam, const char *const *label_values)
{
    if (fam == NULL || (fam->n_labels > 0 && label_values == NULL))
        return;
    for (size_t i = 0; i < fam->n_labels; i++)
        if (label_values[i] == NULL)
            return;
    uint64_t h = hash_values(label_values, fam->n_labels);
    pthread_mutex_lock(&fam->lock);
    baton_metric_child_t *c = child_find_locked(fam, label_values, h);
    if (c != NULL)
        atomic_store(&c->removed, 1);
    pthread_mutex_unlock(&fam->lock);
}

void baton_counter_add(baton_metric_child_t *c, double v)
{
    if (c == NULL || !(v >= 0) || isinf(v)) /* also rejects NaN */
        return;
    atomic_add_double(&c->value_bits, v);
}

void baton_gauge_set(baton_metric_child_t *c, double v)
{
    if (c == NULL)
        return;
    atomic_store_explicit(&c->value_bits, dbl_bits(v), memory_order_relaxed);
}

void baton_gauge_add(baton_metric_child_t *c, double v)
{
    if (c == NULL || isnan(v))
        return;
    atomic_add_double(&c->value_bits, v);
}

void baton_histogram_observe(baton_metric_child_t *c, double v)
{
    if (c == NULL || isnan(v) || c->fam->type != BATON_METRIC_HISTOGRAM)
        return;
    const baton_metric_family_t *fam = c->fam;
    size_t i = 0;
    while (i < fam->n_buckets && v > fam->buckets[i])
        i++;
    atomic_fetch_add_explicit(&c->counts[i], 1, memory_order_relaxed);
    atomic_add_double(&c->value_bits, v);
}

double baton_metric_value(const baton_metric_child_t *c)
{
    if (c == NULL)
        return 0.0;
    return bits_dbl(
        atomic_load_explicit(&((baton_metric_child_t *)c)->value_bits, memory_order_relaxed));
}

void baton_counter_inc_labels(baton_metric_family_t *fam, const char *const *label_values)
{
    baton_counter_add(baton_metric_child(fam, label_values), 1.0);
}

/* ---- text format 0.0.4 ---- */

/* Go's strconv.ParseFloat (what Prometheus uses) reads all of these. Integral values are
 * printed without exponent; others with the fewest digits that read back exactly. */
static void format_double(char *buf, size_t len, double v)
{
    if (isnan(v)) {
        snprintf(buf, len, "NaN");
    } else if (isinf(v)) {
        snprintf(buf, len, v > 0 ? "+Inf" : "-Inf");
    } else if (v == floor(v) && fabs(v) < 1e15) {
        snprintf(buf, len, "%.0f", v == 0 ? 0.0 : v); /* no "-0" */
    } else {
        for (int prec = 1; prec <= 17; prec++) {
            snprintf(buf, len, "%.*g", prec, v);
            if (strtod(buf, NULL) == v)
                return;
        }
    }
}

static int append_escaped(baton_buf_t *out, const char *s, int quote)
{
    const char *run = s;
    for (const char *p = s;; p++) {
        const char *rep = NULL;
        if (*p == '\\')
            rep = "\\\\";
        else if (*p == '\n')
            rep = "\\n";
        else if (quote && *p == '"')
            rep = "\\\"";
        else if (*p != '\0')
            continue;
        if (baton_buf_append(out, run, (size_t)(p - run)) != 0)
            return BATON_ENOMEM;
        if (rep == NULL)
            return 0;
        if (baton_buf_append_str(out, rep) != 0)
            return BATON_ENOMEM;
        run = p + 1;
    }
}

/* name{l1="v1",...[,le="x"]} value\n */
static int append_sample(baton_buf_t *out, const baton_metric_family_t *fam,
                         const baton_metric_child_t *c, const char *suffix, const char *le,
                         double value)
{
    int rc = baton_buf_printf(out, "%s%s", fam->name, suffix);
    size_t n = 0;
    for (size_t i = 0; rc == 0 && i < fam->n_labels; i++, n++) {
        rc = baton_buf_printf(out, "%s%s=\"", n ? "," : "{", fam->label_names[i]);
        if (rc == 0)
            rc = append_escaped(out, c->label_values[i], 1);
        if (rc == 0)
            rc = baton_buf_append_str(out, "\"");
    }
    if (rc == 0 && le != NULL) {
        rc = baton_buf_printf(out, "%sle=\"%s\"", n ? "," : "{", le);
        n++;
    }
    if (rc == 0 && n > 0)
        rc = baton_buf_append_str(out, "}");
    char num[64];
    format_double(num, sizeof(num), value);
    if (rc == 0)
        rc = baton_buf_printf(out, " %s\n", num);
    return rc == 0 ? 0 : BATON_ENOMEM;
}

static int render_child(baton_buf_t *out, const baton_metric_family_t *fam, baton_metric_child_t *c)
{
    if (fam->type != BATON_METRIC_HISTOGRAM)
        return append_sample(out, fam, c, "", NULL, baton_metric_value(c));
    /* Cumulative counts are computed from one read of each bucket so that the +Inf bucket and
     * _count agree even while other threads observe. */
    uint64_t cum = 0;
    char le[64];
    for (size_t i = 0; i <= fam->n_buckets; i++) {
        cum += atomic_load_explicit(&c->counts[i], memory_order_relaxed);
        if (i < fam->n_buckets)
            format_double(le, sizeof(le), fam->buckets[i]);
        else
            snprintf(le, sizeof(le), "+Inf");
        if (append_sample(out, fam, c, "_bucket", le, (double)cum) != 0)
            return BATON_ENOMEM;
    }
    if (append_sample(out, fam, c, "_sum", NULL, baton_metric_value(c)) != 0 ||
        append_sample(out, fam, c, "_count", NULL, (double)cum) != 0)
        return BATON_ENOMEM;
    return 0;
}

static const char *type_name(baton_metric_type_t t)
{
    switch (t) {
    case BATON_METRIC_COUNTER:
        return "counter";
    case BATON_METRIC_GAUGE:
        return "gauge";
    case BATON_METRIC_HISTOGRAM:
        return "histogram";
    }
    return "untyped";
}

int baton_metrics_render(baton_metrics_t *reg, baton_buf_t *out)
{
    if (reg == NULL || out == NULL)
        return BATON_EINVAL;
    size_t start_len = out->len;
    int rc = 0;
    pthread_mutex_lock(&reg->lock);
    for (baton_metric_family_t *fam = reg->first; rc == 0 && fam != NULL; fam = fam->next) {
        rc = baton_buf_printf(out, "# HELP %s ", fam->name);
        if (rc == 0)
            rc = append_escaped(out, fam->help, 0);
        if (rc == 0)
            rc = baton_buf_printf(out, "\n# TYPE %s %s\n", fam->name, type_name(fam->type));
        if (rc != 0)
            break;
        pthread_mutex_lock(&fam->lock);
        for (baton_metric_child_t *c = fam->first; rc == 0 && c != NULL; c = c->next) {
            if (!atomic_load(&c->removed))
                rc = render_child(out, fam, c);
        }
        pthread_mutex_unlock(&fam->lock);
    }
    pthread_mutex_unlock(&reg->lock);
    if (rc != 0) {
        /* Leave the buffer as it was rather than half a document. */
        out->len = start_len;
        if (out->data != NULL)
            out->data[start_len] = '\0';
        return BATON_ENOMEM;
    }
    return 0;
}
