/* responses.c — the Responses API at the router: its own error event, and which worker holds
 * each response (GET/DELETE by id go there). */
#include "router/dataplane/responses.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "baton/error.h"

int baton_responses_error_event(baton_buf_t *out, const char *message, const char *code,
                                uint64_t seq)
{
    json_t *j = json_pack(
        "{s:s,s:s,s:s,s:n,s:I}", "type", "error", "code", code ? code : "upstream_error", "message",
        message ? message : "upstream request failed", "param", "sequence_number", (json_int_t)seq);
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    int rc = s ? baton_buf_printf(out, "event: error\ndata: %s\n\n", s) : BATON_ENOMEM;
    free(s);
    return rc ? BATON_ENOMEM : 0;
}

/* ---- which worker holds which response ---- */

#define RESP_ID_MAX 128
#define NOTE_SCAN   4096

typedef struct {
    char id[RESP_ID_MAX];
    char worker[BATON_WORKER_ID_MAX];
} resp_entry_t;

/* A ring of the last ids (newest overwrites oldest), searched newest first. */
static pthread_mutex_t resp_mu = PTHREAD_MUTEX_INITIALIZER;
static resp_entry_t *resp_ring;
static size_t resp_next, resp_count;

static void remember(const char *id, size_t len, const char *worker_id)
{
    pthread_mutex_lock(&resp_mu);
    if (!resp_ring)
        resp_ring = calloc(BATON_RESPONSES_KEPT, sizeof(*resp_ring));
    if (resp_ring) {
        resp_entry_t *e = &resp_ring[resp_next];
        memcpy(e->id, id, len);
        e->id[len] = '\0';
        snprintf(e->worker, sizeof(e->worker), "%s", worker_id);
        resp_next = (resp_next + 1) % BATON_RESPONSES_KEPT;
        if (resp_count < BATON_RESPONSES_KEPT)
            resp_count++;
    }
    pthread_mutex_unlock(&resp_mu);
}

/* The worker that answered `id` into worker[]; 0 when unknown. */
static int lookup(const char *id, char worker[BATON_WORKER_ID_MAX])
{
    int found = 0;
    pthread_mutex_lock(&resp_mu);
    for (size_t k = 0; k < resp_count && !found; k++) {
        size_t i = (resp_next + BATON_RESPONSES_KEPT - 1 - k) % BATON_RESPONSES_KEPT;
        if (strcmp(resp_ring[i].id, id) == 0) {
            memcpy(worker, resp_ring[i].worker, BATON_WORKER_ID_MAX);
            found = 1;
        }
    }
    pthread_mutex_unlock(&resp_mu);
    return found;
}

void baton_responses_note(const char *worker_id, const char *data, size_t len, size_t *seen,
                          int *done)
{
    static const char key[] = "\"id\":";
    if (*done)
        return;
    size_t n = len;
    if (*seen + n > NOTE_SCAN)
        n = NOTE_SCAN - *seen;
    *seen += n;
    const char *p = data, *end = data + n;
    while ((p = memmem(p, (size_t)(end - p), key, sizeof(key) - 1)) != NULL) {
        p += sizeof(key) - 1;
        while (p < end && *p == ' ')
            p++;
        if (end - p < 6 || memcmp(p, "\"resp", 5) != 0)
            continue;
        const char *v = p + 1, *q = memchr(v, '"', (size_t)(end - v));
        size_t vlen = q ? (size_t)(q - v) : 0;
        if (!q || vlen >= RESP_ID_MAX || memchr(v, '\\', vlen))
            continue;
        remember(v, vlen, worker_id);
        *done = 1;
        return;
    }
    if (*seen >= NOTE_SCAN)
        *done = 1;
}

void baton_responses_by_id(baton_proxy_loop_t *pl, baton_http_req_t *req, const char *route)
{
    baton_router_t *r = baton_proxy_loop_router(pl);
    const char *id = req->path + strlen(BATON_RESPONSES_PREFIX);
    char worker[BATON_WORKER_ID_MAX];
    if (lookup(id, worker) && baton_proxy_forward_to(pl, req, route, worker) == 0)
        return;
    char msg[200];
    snprintf(msg, sizeof(msg), "Response with id '%.120s' not found.", id);
    baton__respond_error(r, req, route, 404, msg, "invalid_request_error", NULL, "not_found");
}
