/* reload.c — SIGHUP: diff of the configured worker sets applied to the registry. */
#include "router/control/reload.h"

#include <stdio.h>
#include <string.h>

#include "baton/error.h"
#include "common/log.h"

static int streq_null(const char *a, const char *b)
{
    if (a == NULL || b == NULL)
        return a == b;
    return strcmp(a, b) == 0;
}

static int norm(const char *url, char out[BATON_WORKER_URL_MAX])
{
    return baton_worker_url_normalize(url, out, BATON_WORKER_URL_MAX, NULL);
}

int baton_reload_same_worker(const baton_config_worker_t *a, const baton_config_worker_t *b)
{
    char na[BATON_WORKER_URL_MAX], nb[BATON_WORKER_URL_MAX];
    if (norm(a->url, na) != 0 || norm(b->url, nb) != 0 || strcmp(na, nb) != 0)
        return 0;
    /* labels: config.c stores them compact (json_dumps), so equal objects compare equal
     * unless their keys were written in another order, which reads as a change (harmless). */
    return a->role == b->role && a->bootstrap_port == b->bootstrap_port &&
           streq_null(a->api_key, b->api_key) && streq_null(a->model_id, b->model_id) &&
           a->priority == b->priority && a->cost == b->cost &&
           streq_null(a->labels_json, b->labels_json) && a->pd_protocol == b->pd_protocol &&
           streq_null(a->engine_id, b->engine_id) &&
           streq_null(a->bootstrap_addr, b->bootstrap_addr) && a->dp_size == b->dp_size;
}

static int add(baton_registry_t *reg, const baton_config_worker_t *cw, char *err, size_t errlen)
{
    char why[256] = "";
    int rc = baton_config_add_worker(reg, cw, why, sizeof(why));
    if (rc == BATON_EEXIST) {
        log_info("router", "reload_adopted url=%s", cw->url);
        return 0;
    }
    if (rc != 0 && err != NULL && errlen > 0)
        snprintf(err, errlen, "worker %s: %s", cw->url, why);
    return rc;
}

int baton_reload_workers(baton_registry_t *reg, const baton_config_t *prev,
                         const baton_config_t *next, baton_reload_result_t *res, char *err,
                         size_t errlen)
{
    baton_reload_result_t r = {0};
    char n[BATON_WORKER_URL_MAX];
    int rc = 0;

    /* Removals first, so a changed worker's URL is free for its new registration. */
    for (size_t i = 0; i < prev->n_workers; i++) {
        const baton_config_worker_t *pw = &prev->workers[i];
        if (norm(pw->url, n) != 0)
            continue;
        long j = baton_config_find_worker(next, next->n_workers, n);
        if (j >= 0 && baton_reload_same_worker(pw, &next->workers[j]))
            continue;
        if (baton_registry_remove_url(reg, n) == 0)
            log_info("router", "reload_%s url=%s", j >= 0 ? "changed" : "removed", n);
        if (j >= 0)
            r.changed++;
        else
            r.removed++;
    }
    for (size_t j = 0; j < next->n_workers && rc == 0; j++) {
        const baton_config_worker_t *nw = &next->workers[j];
        if (norm(nw->url, n) != 0)
            continue;
        long i = baton_config_find_worker(prev, prev->n_workers, n);
        if (i >= 0 && baton_reload_same_worker(&prev->workers[i], nw)) {
            r.unchanged++;
            baton_worker_t *w = baton_registry_find_url(reg, n);
            if (w != NULL) {
                baton_worker_unref(w);
                continue;
            }
        } else if (i < 0) {
            r.added++;
        }
        rc = add(reg, nw, err, errlen);
    }
    if (res != NULL)
        *res = r;
    return rc;
}
