/* responses_store.h — the worker's stored responses, so previous_response_id continues one. */
#ifndef BATON_WORKER_RESPONSES_STORE_H
#define BATON_WORKER_RESPONSES_STORE_H

#include <stddef.h>

#include <jansson.h>

#include "worker/request.h"
#include "worker/worker.h"

/* Responses kept per worker (the oldest is forgotten past it). */
#define WK_RESPONSES_KEPT 4096

/*
 * Before parsing a /v1/responses body: *conv = its input as items (a string is one user
 * message), preceded by the stored conversation of previous_response_id when it names one, and
 * *out = the body with that whole conversation as its input (NULL when the body is used as it
 * is; free() it). 0; BATON_ENOTFOUND with err filled (404 previous_response_not_found) for an
 * unknown id; BATON_ENOMEM. A body that is not a valid request gives 0 and no conv (the parser
 * answers it).
 */
int wk_resp_prepare(wk_worker_t *w, const char *body, size_t len, char **out, json_t **conv,
                    wk_parse_err_t *err);

/* Keeps response `id`: conv (not taken) followed by the assistant's text. */
void wk_resp_store(wk_worker_t *w, const char *id, json_t *conv, const char *text, size_t len);

/* Frees every stored response (at shutdown). */
void wk_resp_free(wk_worker_t *w);

#endif
