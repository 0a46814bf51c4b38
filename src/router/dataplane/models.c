/* models.c — the router's answers about models: the union of its workers' model lists, one
 * model by id, and model_not_found for a model no worker serves. */
#include "router/dataplane/models.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "baton/error.h"
#include "router/control/worker_models.h"
#include "router/dataplane/router_metrics.h"

static const baton_worker_role_t info_roles[] = {BATON_ROLE_DECODE, BATON_ROLE_REGULAR,
                                                 BATON_ROLE_PREFILL};

/* OpenAI's own wording and code for a model that does not exist. */
static void not_found(baton_router_t *r, baton_http_req_t *req, const char *route,
                      const char *model)
{
    char msg[400];
    snprintf(msg, sizeof(msg), "The model `%.300s` does not exist.", model);
    baton__respond_error(r, req, route, 404, msg, "invalid_request_error", "model",
                         "model_not_found");
}

int baton_models_refuse(baton_router_t *r, baton_http_req_t *req, const char *route,
                        const baton_pdreq_t *pd)
{
    const baton_json_val_t *v = baton_pdreq_get(pd, "model");
    if (!v || v->type != BATON_JSON_STRING || !baton_json_str_len(v))
        return 0;
    baton_buf_t b = BATON_BUF_INIT;
    if (baton_json_str_append(v, &b) || baton_buf_append(&b, "", 1)) {
        baton_buf_free(&b);
        return 0; /* out of memory: the pick decides */
    }
    int refuse = baton_models_classify(r->registry, b.data) == BATON_POOL_UNKNOWN;
    if (refuse) {
        not_found(r, req, route, b.data);
        baton_router_metrics_model_done(r->metrics, "other", 404);
    }
    baton_buf_free(&b);
    return refuse;
}

void baton_models_list(baton_proxy_loop_t *pl, baton_http_req_t *req, const char *route)
{
    baton_router_t *r = baton_proxy_loop_router(pl);
    size_t unnamed = 0;
    json_t *data = baton_models_union(r->registry, &unnamed);
    if (data && json_array_size(data) == 0) {
        /* No worker names a model: ask one (its own list, as a single-model router would). */
        if (baton_proxy_forward(pl, req, route, info_roles, 3) == 0) {
            json_decref(data);
            return;
        }
    }
    baton__respond_json(r, req, route, 200,
                        data ? json_pack("{s:s,s:o}", "object", "list", "data", data) : NULL);
}

void baton_models_get(baton_proxy_loop_t *pl, baton_http_req_t *req, const char *route)
{
    baton_router_t *r = baton_proxy_loop_router(pl);
    const char *id = req->path + strlen(BATON_MODELS_PREFIX);
    /* The id as the client wrote it in the path ("org/name" is two segments, kept whole). */
    json_t *data = baton_models_union(r->registry, NULL);
    if (!data) {
        baton__respond_json(r, req, route, 500, NULL);
        return;
    }
    size_t i;
    json_t *m;
    json_array_foreach(data, i, m)
    {
        if (strcmp(json_string_value(json_object_get(m, "id")), id) == 0) {
            json_incref(m);
            json_decref(data);
            baton__respond_json(r, req, route, 200, m);
            return;
        }
    }
    json_decref(data);
    baton_model_pool_t pool = baton_models_classify(r->registry, id);
    if (pool != BATON_POOL_UNKNOWN && baton_proxy_forward(pl, req, route, info_roles, 3) == 0)
        return;
    not_found(r, req, route, id);
}
