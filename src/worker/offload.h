/* offload.h — decode-side KV offload (SGLang's --disaggregation-decode-enable-offload-kvcache):
 * a decoding request's pages copied to L2 (and on to L3) on a thread of their own while it
 * decodes, without the races SGLang had. */
#ifndef BATON_WORKER_OFFLOAD_H
#define BATON_WORKER_OFFLOAD_H

#include <stdint.h>
#include <uv.h>

#include "worker/kvpool.h"
#include "worker/kvshape.h"
#include "worker/tier_l2.h"

/*
 * A request's pages: the prompt's whole pages are copied out of its L1 pages (the pool region,
 * laid out [layer][slot][page bytes]); pages of generated tokens are written from the KV
 * definition (the simulated engine keeps no pool pages for them). Each copy is one job on the
 * offload thread; the loop commits the L2 page and hands it on (page_cb: to L3). A page already
 * in L2 (an earlier turn's, or another request's with the same prefix) is not copied: the
 * request pins it until its own copies are done, so the chain its new pages hang on is not
 * evicted under them (a lookup stops at the first missing page).
 *
 * Race-freedom, the four ways SGLang's decode offload garbled outputs under load:
 *   1. pages freed at a request's first offload while it still decodes;
 *   2. pages freed when the request finishes while its copies are in flight;
 *   3. offload state looked up by request id, so a reused id inherits a late completion;
 *   4. pages owned by the prefix cache freed by the offload path.
 * Here every copy is counted on the request's OWN object (never looked up by id), and that
 * object holds one unit of work on the request's lease from its first copy until the count is
 * zero after the request let go: the pages return to the pool only then, whatever the order of
 * finish, abort and completions. The cache that owns pages the offload touches is L2 (the
 * worker's prefix cache owns no pool pages: a hit is rewritten into the request's own pages,
 * and its holds are released through its own count, job_cache.c): the offload writes only slots
 * it allocated (FILLING, pinned for it alone), takes a found page with a pin and lets go of it
 * with an unpin when the request's object goes, and never frees an L2 slot; a slot goes only by
 * the pool's own eviction, which passes every pinned one, so another request's lookup holding
 * the same page reads the bytes it found.
 *
 * Test builds only (compiled with WK_OFFLOAD_FAULTS, never in baton-worker): the environment
 * variable BATON_OFFLOAD_FAULT=1|2|3|4 re-enables race 1, 2, 3 or 4 (4: the request frees the L2
 * pages it found instead of unpinning them), and BATON_OFFLOAD_DELAY_US
 * slows every copy, so that the stress test (tests/unit/worker/test_offload_stress.c) can show
 * it detects each.
 *
 * Threads: every call on the loop's thread; the copies on the offload thread.
 */

typedef struct wk_offload_s wk_offload_t;
typedef struct wk_offload_req_s wk_offload_req_t;

typedef struct {
    wk_kvshape_t shape;
    const uint8_t *l1_base; /* the pool region */
    uint32_t l1_slots;      /* slots per layer in it */
    wk_l2_t *l2;
    /* Drops one unit of work (hold 0) or the request's hold (WK_KV_HOLD_USER, fault 1 only) on
     * a lease; the owner returns released slots to its pool and serves waiters. */
    void (*lease_drop)(void *ud, wk_kvlease_t *l, unsigned hold);
    /* A page landed in L2 slot `slot`, pinned once for the callee (unpin when done with it). */
    void (*page_cb)(void *ud, int32_t slot);
    void *ud;
} wk_offload_cfg_t;

typedef struct {
    uint64_t pages, bytes, skipped; /* copied; not copied (no L2 slot, or already there) */
    uint64_t bad_copies;            /* copies that did not match the KV definition */
} wk_offload_stats_t;

/* Starts the offload thread. 0 or an error. */
int wk_offload_create(wk_offload_t **o_p, uv_loop_t *loop, const wk_offload_cfg_t *cfg);
/* Stops the thread after the queued copies; cb runs once every request object is gone. */
void wk_offload_close(wk_offload_t *o, void (*cb)(void *arg), void *arg);
void wk_offload_stats(const wk_offload_t *o, wk_offload_stats_t *st);

/*
 * A request starts decoding with its prompt's KV in the pages of `lease` (ppl = slots per
 * layer, page p of every layer in lease->slots[p]). `rid` is the client's request id (only the
 * fault-3 switch uses it). The prompt's whole pages are queued at once. NULL when out of memory
 * (nothing is offloaded then).
 */
wk_offload_req_t *wk_offload_begin(wk_offload_t *o, wk_kvlease_t *lease, const int64_t *ids,
                                   uint32_t n_prompt, uint64_t rid);
/* Tokens were generated: ids[0..n) is the prompt and every token so far; whole pages not yet
 * queued are queued. */
void wk_offload_tokens(wk_offload_req_t *r, const int64_t *ids, uint32_t n);
/* The request lets go (finished or aborted; its own hold on the lease is dropped by its owner,
 * after this call). The object goes when its last copy completed. */
void wk_offload_end(wk_offload_req_t *r);

#endif
