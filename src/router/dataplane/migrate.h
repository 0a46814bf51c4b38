/* migrate.h — what the client has of a stream (per sequence: its text, tokens, whether it
 * ended), the continuation that carries it to another worker, and the rewrite that makes the
 * continued stream read as the one the client started. */
#ifndef BATON_ROUTER_MIGRATE_H
#define BATON_ROUTER_MIGRATE_H

#include <stddef.h>
#include <stdint.h>

#include "common/buf.h"
#include "router/dataplane/pdreq.h"

/*
 * A streamed request whose worker takes continuations (its answer carries the header
 * BATON_MIG_HEADER: baton-worker) is followed event by event: the router keeps, per sequence
 * (choices[].index, or /generate's batch index), the text the client got, the token count where
 * the stream says it (/generate's meta_info.completion_tokens) and whether its finishing chunk
 * went out. When the stream breaks, the next attempt carries all that as
 * "baton_continuation" (docs/WORKER.md "Continuations") and its events go to the client with
 * the first stream's id and created, so the client sees one stream.
 * Plain data; one per request, on its loop's thread.
 */

#define BATON_MIG_HEADER "X-Baton-Continuation"

typedef struct baton_mig_seq_s {
    baton_buf_t text;
    long long tokens; /* -1: the stream does not say */
    unsigned seen : 1;
    unsigned finished : 1;
} baton_mig_seq_t;

typedef struct baton_mig_s {
    baton_api_t api;
    size_t n_seq;
    baton_mig_seq_t *seq;
    char id[128]; /* the first stream's id ("" before its first event) */
    int64_t created;
    unsigned migrations;  /* continuations started */
    unsigned capable : 1; /* the current attempt's worker takes continuations */
    unsigned usage : 1;   /* the usage chunk went out: only [DONE] is missing */
    unsigned done : 1;    /* [DONE] went out */
    unsigned broken : 1;  /* an event was not understood: the stream cannot be continued */
    baton_buf_t member;   /* ,"baton_continuation":{...} for the next attempt */
} baton_mig_t;

/* NULL when the request cannot be continued at all (not streamed, logprobs, Responses API, a
 * route that is not chat / completions / generate) or out of memory. */
baton_mig_t *baton_mig_new(const baton_pdreq_t *req);
void baton_mig_free(baton_mig_t *m);

/*
 * One whole event the worker sent (its "data:" payload, "[DONE]" included). Notes what the
 * client gets from it. After a migration the event's id and created are the first stream's:
 * returns 1 and fills `out` with the whole event to send instead ("data: ...\n\n"); 0: send it
 * as it came; BATON_ENOMEM.
 */
int baton_mig_event(baton_mig_t *m, const char *payload, size_t len, baton_buf_t *out);

/* Whether the stream can be continued now (capable, nothing broken, [DONE] not sent). */
int baton_mig_possible(const baton_mig_t *m);

/* Builds m->member for the next attempt. 0 or BATON_ENOMEM. */
int baton_mig_build(baton_mig_t *m);

#endif
