/* resp_history.h — the conversations of the Responses answers this router relayed, so that a
 * follow-up (previous_response_id) reaches its workers with the whole conversation as input. */
#ifndef BATON_ROUTER_RESP_HISTORY_H
#define BATON_ROUTER_RESP_HISTORY_H

#include <stddef.h>

#include "common/buf.h"

/*
 * A worker keeps the responses it answered itself, so previous_response_id works only where
 * the earlier response was answered: not in PD (the prefill never answered it; the decode that
 * did may not be picked), nor across regular workers. The router keeps each relayed answer's
 * conversation — its input as items (a string is one user message), then the assistant's
 * message with the output text, as baton-worker stores it — and sends a follow-up whose
 * previous_response_id it knows with that conversation followed by the new input as `input`,
 * and without previous_response_id: every worker of any mode then computes the same prompt.
 * An id the router does not know goes as it came (the worker answers it, or 404s).
 *
 * The last BATON_RESP_HISTORY_KEPT conversations are kept, router-wide (thread-safe); one whose
 * JSON is over BATON_RESP_HISTORY_MAX_BYTES is not kept.
 */
#define BATON_RESP_HISTORY_KEPT      4096
#define BATON_RESP_HISTORY_MAX_BYTES ((size_t)1 << 20)

/*
 * A /v1/responses body before it is sent. *conv = its conversation so far as compact JSON
 * (malloc'd; NULL when the body is not understood: it goes as it came), and, when
 * previous_response_id names a kept conversation, `expanded` = the body with that conversation
 * and the new input as `input` and without previous_response_id (left empty otherwise).
 * 0 or BATON_ENOMEM.
 */
int baton_resp_history_prepare(const char *body, size_t len, baton_buf_t *expanded, char **conv);

/*
 * An answer (a JSON response object, or a stream event's data: response.completed or
 * response.incomplete) went to the client: keeps conv followed by the assistant's output text
 * under the answer's id. Anything else is ignored.
 */
void baton_resp_history_note(const char *conv, const char *answer, size_t len);

/* Whether a stream event's data is the one baton_resp_history_note keeps. */
int baton_resp_history_final_event(const char *data, size_t len);

#endif
