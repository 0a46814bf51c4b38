/* worker_models.c — the models each worker serves (model_id or its own /v1/models list) and the
 * pool a request's model selects. */
#include "router/control/worker_models.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "baton/error.h"
#include "common/buf.h"

#define MODELS_MAX   256
#define MODEL_ID_MAX 256
#define SNAP_STACK   64

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Guards every worker's models_found (swapped whole, read in place). */
static pthread_mutex_t found_mu = PTHREAD_MUTEX_INITIALIZER;
/* Raised whenever a worker's found list changes content. */
static _Atomic uint64_t found_version;

/* 1 when the '\n'-separated list holds name. */
static int list_has(const char *list, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = list; p && *p;) {
        const char *end = strchr(p, '\n');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == n && memcmp(p, name, n) == 0)
            return 1;
        p = end ? end + 1 : NULL;
    }
    return 0;
}

int baton_worker_serves(const baton_worker_t *w, const char *model)
{
    if (w->model_id)
        return strcmp(w->model_id, model) == 0;
    pthread_mutex_lock(&found_mu);
    int hit = list_has(w->models_found, model);
    pthread_mutex_unlock(&found_mu);
    return hit;
}

int baton_worker_named(const baton_worker_t *w)
{
    if (w->model_id)
        return 1;
    pthread_mutex_lock(&found_mu);
    int named = w->models_found != NULL && w->models_found[0] != '\0';
    pthread_mutex_unlock(&found_mu);
    return named;
}

int baton_worker_in_pool(const baton_worker_t *w, baton_model_pool_t pool, const char *model)
{
    switch (pool) {
    case BATON_POOL_ANY:
        return 1;
    case BATON_POOL_NAMED:
        return model && baton_worker_serves(w, model);
    case BATON_POOL_UNNAMED:
        return !baton_worker_named(w);
    default:
        return 0;
    }
}

int baton_worker_models_found(baton_worker_t *w, const char *body, size_t len)
{
    json_t *j = json_loadb(body, len, 0, NULL);
    json_t *data = json_is_object(j) ? json_object_get(j, "data") : NULL;
    if (!json_is_array(data)) {
        json_decref(j);
        return BATON_EINVAL;
    }
    baton_buf_t b = BATON_BUF_INIT;
    size_t i, kept = 0;
    json_t *m;
    json_array_foreach(data, i, m)
    {
        const char *id = json_string_value(json_object_get(m, "id"));
        if (!id || !id[0] || strlen(id) > MODEL_ID_MAX || strchr(id, '\n') || kept >= MODELS_MAX)
            continue;
        if ((b.len && baton_buf_append(&b, "\n", 1)) || baton_buf_append(&b, id, strlen(id))) {
            baton_buf_free(&b);
            json_decref(j);
            return BATON_ENOMEM;
        }
        kept++;
    }
    json_decref(j);
    if (baton_buf_append(&b, "", 1)) {
        baton_buf_free(&b);
        return BATON_ENOMEM;
    }
    char *old;
    pthread_mutex_lock(&found_mu);
    old = w->models_found;
    w->models_found = b.data;
    pthread_mutex_unlock(&found_mu);
    if (!old || strcmp(old, b.data) != 0)
        atomic_fetch_add(&found_version, 1); /* the pools' cache is stale */
    free(old);
    return 0;
}

/* A copy of w's models as a '\n'-separated list ("" when unnamed); NULL when out of memory. */
static char *models_copy(const baton_worker_t *w)
{
    if (w->model_id)
        return strdup(w->model_id);
    pthread_mutex_lock(&found_mu);
    char *c = strdup(w->models_found ? w->models_found : "");
    pthread_mutex_unlock(&found_mu);
    return c;
}

/* Calls fn(id, arg) for each '\n'-separated id of list, ids as NUL-terminated strings (list
 * is cut in place). */
static void each_id(char *list, void (*fn)(const char *id, void *arg), void *arg)
{
    for (char *p = list; p && *p;) {
        char *end = strchr(p, '\n');
        if (end)
            *end = '\0';
        fn(p, arg);
        p = end ? end + 1 : NULL;
    }
}

/* The registered workers (every role): ws, n; release with baton_workers_release(ws, n, stack). */
static size_t snapshot(baton_registry_t *reg, baton_worker_t **stack, baton_worker_t ***ws)
{
    return baton_registry_snapshot_all(reg, BATON_ROLE_ANY, BATON_SNAP_ALL, stack, SNAP_STACK, ws);
}

typedef struct {
    json_t *set;    /* every id seen: id → true */
    size_t unnamed; /* workers with no model */
    int oom;
} survey_t;

static void note_id(const char *id, void *arg)
{
    survey_t *s = arg;
    if (json_object_set_new(s->set, id, json_true()) != 0)
        s->oom = 1;
}

/* Every registered worker's models into s (removed workers aside). */
static void survey(baton_registry_t *reg, survey_t *s)
{
    baton_worker_t *stack[SNAP_STACK], **ws;
    size_t n = snapshot(reg, stack, &ws);
    for (size_t i = 0; i < n && !s->oom; i++) {
        if (baton_worker_is_removed(ws[i]))
            continue;
        char *list = models_copy(ws[i]);
        if (!list) {
            s->oom = 1;
            break;
        }
        if (!list[0])
            s->unnamed++;
        each_id(list, note_id, s);
        free(list);
    }
    baton_workers_release(ws, n, stack);
}

/* The survey every request's pool is chosen from, kept until the registry or a found list
 * changes (a request pays one look-up, not a walk over the workers). */
static pthread_mutex_t cache_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
    baton_registry_t *reg;
    uint64_t gen, found;
    json_t *set;
    size_t unnamed;
} cache;

baton_model_pool_t baton_models_classify(baton_registry_t *reg, const char *model)
{
    if (!model)
        return BATON_POOL_ANY;
    baton_model_pool_t pool = BATON_POOL_ANY;
    pthread_mutex_lock(&cache_mu);
    uint64_t gen = baton_registry_generation(reg), found = atomic_load(&found_version);
    if (!cache.set || cache.reg != reg || cache.gen != gen || cache.found != found) {
        survey_t s = {.set = json_object()};
        if (s.set)
            survey(reg, &s);
        json_decref(cache.set);
        cache.set = NULL;
        if (s.set && !s.oom) {
            cache.set = s.set;
            cache.reg = reg;
            cache.gen = gen;
            cache.found = found;
            cache.unnamed = s.unnamed;
        } else {
            json_decref(s.set);
        }
    }
    if (cache.set) {
        size_t names = json_object_size(cache.set);
        if (json_object_get(cache.set, model))
            pool = BATON_POOL_NAMED;
        else if (names > 1)
            pool = cache.unnamed ? BATON_POOL_UNNAMED : BATON_POOL_UNKNOWN;
    }
    pthread_mutex_unlock(&cache_mu);
    return pool;
}

int baton_models_known(baton_registry_t *reg, const char *model)
{
    return model && baton_models_classify(reg, model) == BATON_POOL_NAMED;
}

json_t *baton_models_union(baton_registry_t *reg, size_t *unnamed)
{
    survey_t s = {.set = json_object()};
    json_t *data = json_array();
    if (!s.set || !data) {
        json_decref(s.set);
        json_decref(data);
        return NULL;
    }
    survey(reg, &s);
    if (unnamed)
        *unnamed = s.unnamed;
    const char *id;
    json_t *v;
    /* Sorted: a stable answer whatever order the workers registered in. */
    size_t n = json_object_size(s.set), k = 0;
    const char **ids = calloc(n ? n : 1, sizeof(*ids));
    if (!ids || s.oom) {
        free(ids);
        json_decref(s.set);
        json_decref(data);
        return NULL;
    }
    json_object_foreach(s.set, id, v) ids[k++] = id;
    qsort(ids, k, sizeof(*ids), cmp_str);
    for (size_t i = 0; i < k; i++)
        if (json_array_append_new(data, json_pack("{s:s,s:s,s:i,s:s}", "id", ids[i], "object",
                                                  "model", "created", 0, "owned_by", "baton"))) {
            json_decref(data);
            data = NULL;
            break;
        }
    free(ids);
    json_decref(s.set);
    return data;
}
