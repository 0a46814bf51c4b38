/* config_workers.c — the configured worker list: workers from the JSON file's "workers" array
 * and from --prefill / --decode / --worker, checked, de-duplicated by URL, and registered. */
#include "router/control/config.h"
#include "router/control/config_int.h"

#include <stdlib.h>
#include <string.h>

#include "baton/error.h"

long baton_config_find_worker(const baton_config_t *cfg, size_t n, const char *norm_url)
{
    char other[BATON_WORKER_URL_MAX];
    for (size_t i = 0; i < n && i < cfg->n_workers; i++)
        if (baton_worker_url_normalize(cfg->workers[i].url, other, sizeof(other), NULL) == 0 &&
            strcmp(norm_url, other) == 0)
            return (long)i;
    return -1;
}

/* Adds w (or replaces the one with its URL among the first replace_below); *index_p: where. */
static int push_worker(baton_config_t *cfg, baton_config_worker_t *w, size_t replace_below,
                       long *index_p)
{
    char norm[BATON_WORKER_URL_MAX];
    long i;
    if (baton_worker_url_normalize(w->url, norm, sizeof(norm), NULL) == 0 &&
        (i = baton_config_find_worker(cfg, replace_below, norm)) >= 0) {
        baton_worker_desc_free(&cfg->workers[i]);
        cfg->workers[i] = *w;
        *index_p = i;
        return 0;
    }
    baton_config_worker_t *ws = realloc(cfg->workers, (cfg->n_workers + 1) * sizeof(*ws));
    if (ws == NULL)
        return BATON_ENOMEM;
    cfg->workers = ws;
    *index_p = (long)cfg->n_workers;
    cfg->workers[cfg->n_workers++] = *w;
    return 0;
}

static int check_worker(const baton_config_worker_t *w, const char *where, char *err, size_t errlen)
{
    char norm[BATON_WORKER_URL_MAX];
    if (baton_worker_url_normalize(w->url, norm, sizeof(norm), NULL) != 0)
        return baton__config_err(err, errlen, BATON_EINVAL,
                                 "%s: invalid worker url '%.200s' (expected http://host:port)",
                                 where, w->url);
    if (w->bootstrap_port != -1 && w->role != BATON_ROLE_PREFILL)
        return baton__config_err(err, errlen, BATON_EINVAL,
                                 "%s: bootstrap_port is only valid for prefill workers", where);
    if (w->bootstrap_port != -1 && (w->bootstrap_port < 1 || w->bootstrap_port > 65535))
        return baton__config_err(err, errlen, BATON_EINVAL,
                                 "%s: bootstrap_port must be in 1..65535", where);
    return 0;
}

int baton__config_json_worker(baton_config_t *cfg, json_t *jw, const char *where, char *err,
                              size_t errlen)
{
    baton_config_worker_t w;
    int rc = baton_worker_desc_from_json(&w, jw, 1, where, err, errlen);
    if (rc == 0)
        rc = check_worker(&w, where, err, errlen);
    long at;
    if (rc == 0) {
        rc = push_worker(cfg, &w, 0, &at);
        if (rc != 0)
            baton__config_err(err, errlen, rc, "out of memory");
    }
    if (rc != 0)
        baton_worker_desc_free(&w);
    return rc;
}

int baton__config_cli_worker(baton_config_t *cfg, baton_worker_role_t role, int argc,
                             char *const argv[], int *i, const char *flag, size_t replace_below,
                             long *index_p, char *err, size_t errlen)
{
    const char *arg = argv[*i];
    const char *url = baton__config_flag_value(argc, argv, i, arg, strlen(flag));
    if (url == NULL)
        return baton__config_err(err, errlen, BATON_EINVAL, "%s: missing URL", flag);
    baton_config_worker_t w;
    baton_worker_desc_init(&w);
    w.role = role;
    /* SGLang's convention: --prefill URL [BOOTSTRAP_PORT]. The second word is a port when it
     * looks like a number (or none/null); anything else is the next flag. */
    if (role == BATON_ROLE_PREFILL && *i + 1 < argc) {
        const char *next = argv[*i + 1];
        uint64_t port;
        if (strcmp(next, "none") == 0 || strcmp(next, "null") == 0) {
            (*i)++;
        } else if (next[0] >= '0' && next[0] <= '9') {
            if (baton__config_parse_u64(next, &port) != 0 || port < 1 || port > 65535)
                return baton__config_err(err, errlen, BATON_EINVAL,
                                         "%s %s: bad bootstrap port '%s' (1..65535 or none)", flag,
                                         url, next);
            w.bootstrap_port = (int)port;
            (*i)++;
        }
    }
    w.url = strdup(url);
    if (w.url == NULL)
        return baton__config_err(err, errlen, BATON_ENOMEM, "out of memory");
    int rc = check_worker(&w, flag, err, errlen);
    if (rc == 0) {
        rc = push_worker(cfg, &w, replace_below, index_p);
        if (rc != 0)
            baton__config_err(err, errlen, rc, "out of memory");
    }
    if (rc != 0)
        baton_worker_desc_free(&w);
    return rc;
}

int baton_config_add_worker(baton_registry_t *reg, const baton_config_worker_t *cw, char *why,
                            size_t whylen)
{
    baton_worker_spec_t spec;
    BATON_WORKER_DESC_COPY_FIELDS(&spec, cw);
    return baton_registry_add(reg, &spec, NULL, why, whylen);
}

int baton_config_apply_workers(const baton_config_t *cfg, baton_registry_t *reg, char *err,
                               size_t errlen)
{
    for (size_t i = 0; i < cfg->n_workers; i++) {
        const baton_config_worker_t *cw = &cfg->workers[i];
        char why[256] = "";
        int rc = baton_config_add_worker(reg, cw, why, sizeof(why));
        if (rc != 0)
            return baton__config_err(err, errlen, rc, "worker %s: %s", cw->url, why);
    }
    return 0;
}
