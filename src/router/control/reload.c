/* reload.c — SIGHUP: diff of the configured worker sets applied to the registry. */
#include "router/control/reload.h"

#include <stdio.h>
#include <string.h>

#include "baton/error.h"
#include "common/log.h"

static int norm(const char *url, char out[BATON_WORKER_URL_MAX])
{
    return baton_worker_url_normalize(url, out, BATON_WORKER_URL_MAX, NULL);
}

int baton_reload_same_worker(const baton_config_worker_t *a, const baton_config_worker_t *b)
{
    baton_worker_spec_t va, vb;
    BATON_WORKER_DESC_COPY_FIELDS(&va, a);
    BATON_WORKER_DESC_COPY_FIELDS(&vb, b);
    return baton_worker_spec_equal(&va, &vb);
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
