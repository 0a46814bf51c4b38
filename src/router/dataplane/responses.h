/* responses.h — what the router itself writes in the OpenAI Responses API's shape. */
#ifndef BATON_ROUTER_RESPONSES_H
#define BATON_ROUTER_RESPONSES_H

#include <stdint.h>

#include "common/buf.h"

/*
 * Appends the stream's error event (`event: error`, data {"type":"error","code","message",
 * "param":null,"sequence_number"}): what a Responses stream ends with when its worker failed
 * after events went out (the API has no [DONE]). `seq` is the number of events already sent.
 * 0 or BATON_ENOMEM.
 */
int baton_responses_error_event(baton_buf_t *out, const char *message, const char *code,
                                uint64_t seq);

#endif
