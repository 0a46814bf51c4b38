/* responses.h — what the router itself writes in the OpenAI Responses API's shape. */
#ifndef BATON_ROUTER_RESPONSES_H
#define BATON_ROUTER_RESPONSES_H

#include <stdint.h>

#include "common/buf.h"
#include "http/server.h"
#include "router/dataplane/proxy.h"

/*
 * Appends the stream's error event (`event: error`, data {"type":"error","code","message",
 * "param":null,"sequence_number"}): what a Responses stream ends with when its worker failed
 * after events went out (the API has no [DONE]). `seq` is the number of events already sent.
 * 0 or BATON_ENOMEM.
 */
int baton_responses_error_event(baton_buf_t *out, const char *message, const char *code,
                                uint64_t seq);

/*
 * Which worker holds a stored response (GET and DELETE /v1/responses/{id} go to it: a worker
 * keeps its responses itself). The router notes the id of each /v1/responses answer that
 * reaches a client: the first "id" whose value begins with "resp" in the answer's first 4 KiB
 * (a JSON body's own id, or the response.created event's response.id). The last
 * BATON_RESPONSES_KEPT ids are kept, per router process; older ones are forgotten (their GET is
 * a 404, as for an id never seen).
 */
#define BATON_RESPONSES_KEPT 16384

/* Notes the id found in data[0..len) for worker_id; *done is set once an id was found or the
 * first 4 KiB went by without one (later calls then return at once). Thread-safe. */
void baton_responses_note(const char *worker_id, const char *data, size_t len, size_t *seen,
                          int *done);

/* GET / DELETE /v1/responses/{id}: forwarded to the worker that answered it; 404 not_found when
 * the id is unknown or its worker is gone. */
void baton_responses_by_id(baton_proxy_loop_t *pl, baton_http_req_t *req, const char *route);

#define BATON_RESPONSES_PREFIX "/v1/responses/"

#endif
