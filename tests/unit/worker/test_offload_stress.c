/* test_offload_stress.c — decode offload under stress: hundreds of concurrent multi-turn
 * sessions over a small page pool and L2 (eviction pressure), groups of sessions sharing a
 * system prompt (L2 pages several requests find and hold at once), client aborts and request
 * ids reused, every decode step reading its own pages and every L2 page a turn finds verified
 * byte for byte when found and again when the turn lets go of it. Built with offload.c's
 * test-only fault switches: `test_worker_offload_stress N` runs with race N re-enabled (0:
 * none) and passes when it detects corruption exactly when a race is on. Bounded in sessions,
 * turns and time. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "worker/kvpattern.h"
#include "worker/kvpool.h"
#include "worker/kvshape.h"
#include "worker/offload.h"
#include "worker/tier_key.h"
#include "worker/tier_l2.h"

#define SESSIONS   300
#define TURNS      3
#define POOL_SLOTS 48
#define L2_PAGES   1024
#define RIDS       16 /* request ids drawn from a small set: reused while others are live */
#define GROUP      10 /* sessions i and i / GROUP * GROUP share their first SHARED tokens */
#define SHARED     16 /* one whole page of the tiny shape */
#define HELD_MAX   16
#define ROOM_MS    10 /* the prefill holds its L2 hits until the request's room has them */

typedef struct session_s {
    int idx, turn, done;
    int64_t *ids;
    uint32_t n; /* prompt tokens of the current turn */
    uint32_t cap;
    uint32_t steps, gen_want;
    uint32_t ppl;
    uint32_t slots[64];
    wk_kvwait_t wait;
    wk_kvlease_t lease;
    int lease_live;
    wk_offload_req_t *off;
    int32_t held[HELD_MAX]; /* the L2 pages the turn found, pinned as the prefill's fetch does */
    uint32_t n_held;
    int32_t held_page[HELD_MAX];
    uv_timer_t step, room;
    uint64_t rng;
} session_t;

static uv_loop_t loop;
static wk_kvshape_t shape;
static uint64_t layer_page_bytes;
static uint8_t *region;
static wk_kvpool_t pool;
static wk_l2_t *l2;
static uint8_t *l2_mem;
static wk_offload_t *off;
static session_t sess[SESSIONS];
static unsigned finished_sessions;
static uint64_t corrupt_reads, corrupt_l2, l2_hits, aborts, turns_done;
static uv_timer_t watchdog;

static uint64_t rnd(session_t *s)
{
    s->rng ^= s->rng << 13;
    s->rng ^= s->rng >> 7;
    s->rng ^= s->rng << 17;
    return s->rng;
}

static uint8_t *page_addr(uint32_t layer, uint32_t slot)
{
    return region + ((uint64_t)layer * POOL_SLOTS + slot) * layer_page_bytes;
}

static void serve_waiters(void);
static void turn_start(session_t *s);
static void start_cb(uv_timer_t *t);

static void lease_drop(void *ud, wk_kvlease_t *l, unsigned hold)
{
    (void)ud;
    int released = hold ? wk_kvlease_drop(&pool, l, hold) : wk_kvlease_work_done(&pool, l);
    if (released)
        serve_waiters();
}

/* The received KV of the prompt goes into the pages (the prefill's write). */
static void fill_prompt(session_t *s)
{
    uint32_t P = shape.page_tokens, tb = (uint32_t)wk_kvshape_token_bytes(&shape);
    for (uint32_t p = 0; p < s->ppl; p++) {
        uint32_t n = s->n - p * P < P ? s->n - p * P : P;
        for (uint32_t l = 0; l < shape.layers; l++)
            wk_kv_fill(page_addr(l, s->slots[p]), tb, s->ids + p * P, p * P, n, l);
    }
}

/* A decode step reads the request's KV: one page of one layer, checked (a page another request
 * overwrote is another request's text in this one's answer). */
static int read_ok(session_t *s)
{
    uint32_t P = shape.page_tokens, tb = (uint32_t)wk_kvshape_token_bytes(&shape);
    uint32_t p = (uint32_t)(rnd(s) % s->ppl), l = (uint32_t)(rnd(s) % shape.layers);
    uint32_t n = s->n - p * P < P ? s->n - p * P : P;
    return wk_kv_check(page_addr(l, s->slots[p]), tb, s->ids + p * P, p * P, n, l, NULL) == 0;
}

/* What the next turn's prefill finds in L2: every page found is checked, then pinned for the
 * turn (the prefill's fetch holds its hits until the request's room has them). */
static void lookup_l2(session_t *s)
{
    uint32_t P = shape.page_tokens, pages = (s->n - 1) / P;
    wk_tier_key_t *k = malloc((pages + 1) * sizeof(*k));
    wk_tier_keys(s->ids, pages * P, P, pages, k);
    s->n_held = 0;
    for (uint32_t p = 0; p < pages && s->n_held < HELD_MAX; p++) {
        int32_t slot = wk_l2_find(l2, &k[p]);
        if (slot < 0)
            break;
        l2_hits++;
        if (wk_tier_page_check(wk_l2_addr(l2, slot), &shape, s->ids + p * P, p * P) != 0) {
            corrupt_l2++;
            break;
        }
        wk_l2_pin(l2, slot);
        s->held_page[s->n_held] = (int32_t)p;
        s->held[s->n_held++] = slot;
    }
    free(k);
}

/* The room has the turn's L2 hits: each read once more (a pinned page nobody may have touched
 * since it was found), then unpinned. */
static void release_l2(session_t *s)
{
    uv_timer_stop(&s->room);
    uint32_t P = shape.page_tokens;
    for (uint32_t i = 0; i < s->n_held; i++) {
        uint32_t p = (uint32_t)s->held_page[i];
        if (wk_tier_page_check(wk_l2_addr(l2, s->held[i]), &shape, s->ids + p * P, p * P) != 0)
            corrupt_l2++;
        wk_l2_unpin(l2, s->held[i]);
    }
    s->n_held = 0;
}

static void room_cb(uv_timer_t *t)
{
    release_l2(t->data);
}

static void turn_end(session_t *s, int finished)
{
    if (finished) {
        /* the answer: gen_want tokens, deterministic per session and turn */
        uint32_t n = s->n + s->gen_want;
        wk_offload_tokens(s->off, s->ids, n);
        s->n = n;
    } else {
        aborts++;
    }
    wk_offload_end(s->off);
    s->off = NULL;
    /* the request lets go of its pages (they return when the offload is done with them) */
    wk_kvlease_t *l = &s->lease;
    lease_drop(NULL, l, WK_KV_HOLD_USER);
    turns_done++;
    if (!finished || ++s->turn == TURNS) {
        s->done = 1;
        finished_sessions++;
        if (finished_sessions == SESSIONS)
            uv_stop(&loop);
        return;
    }
    /* the next turn: history plus a new message */
    for (uint32_t i = 0; i < 20; i++)
        s->ids[s->n + i] = 900000 + s->idx * 1000 + s->turn * 100 + i;
    s->n += 20;
    /* the user thinks: the offload catches up meanwhile */
    uv_timer_start(&s->step, start_cb, 50 + rnd(s) % 50, 0);
}

static void step_cb(uv_timer_t *t)
{
    session_t *s = t->data;
    if (!read_ok(s))
        corrupt_reads++;
    s->steps++;
    if (s->steps == 3 && rnd(s) % 10 == 0) { /* the client goes away */
        turn_end(s, 0);
        return;
    }
    if (s->steps >= s->gen_want) {
        turn_end(s, 1);
        return;
    }
    uv_timer_start(&s->step, step_cb, 0, 0);
}

/* The pages are there: the KV arrives, the offload starts, decoding runs. */
static void turn_go(session_t *s)
{
    wk_kvlease_init(&s->lease, s->slots, s->ppl, WK_KV_HOLD_USER);
    fill_prompt(s);
    release_l2(s);
    lookup_l2(s);
    uv_timer_start(&s->room, room_cb, ROOM_MS, 0);
    /* generated tokens: ids the next turn sends back */
    for (uint32_t i = 0; i < s->gen_want; i++)
        s->ids[s->n + i] = 500000 + s->idx * 1000 + s->turn * 100 + i;
    s->off = wk_offload_begin(off, &s->lease, s->ids, s->n, (uint64_t)(rnd(s) % RIDS));
    s->steps = 0;
    uv_timer_start(&s->step, step_cb, 0, 0);
}

static void serve_waiters(void)
{
    wk_kvwait_t *w;
    while ((w = wk_kvpool_next_ready(&pool)) != NULL)
        turn_go(w->data);
}

static void turn_start(session_t *s)
{
    s->gen_want = 24;
    s->ppl = (s->n + shape.page_tokens - 1) / shape.page_tokens;
    int rc = wk_kvpool_take(&pool, s->ppl, s->slots);
    if (rc == 0) {
        turn_go(s);
        return;
    }
    s->wait = (wk_kvwait_t){.n = s->ppl, .slots = s->slots, .data = s};
    wk_kvpool_wait(&pool, &s->wait);
}

static void start_cb(uv_timer_t *t)
{
    session_t *s = t->data;
    turn_start(s);
}

static void watchdog_cb(uv_timer_t *t)
{
    (void)t;
    uv_stop(&loop);
}

/* With a race on, the run ends as soon as it was seen (its leaks would starve the pool). */
static int fault_on;
static uv_timer_t seen;

static void seen_cb(uv_timer_t *t)
{
    wk_offload_stats_t st;
    (void)t;
    wk_offload_stats(off, &st);
    if (corrupt_reads + corrupt_l2 + st.bad_copies > 0)
        uv_stop(&loop);
}

int main(int argc, char **argv)
{
    int fault = argc > 1 ? atoi(argv[1]) : 0;
    char fv[8];
    snprintf(fv, sizeof(fv), "%d", fault);
    setenv("BATON_OFFLOAD_FAULT", fv, 1);
    setenv("BATON_OFFLOAD_DELAY_US", "20", 1);
    fault_on = fault != 0;
    uv_loop_init(&loop);
    wk_kvshape_preset("tiny", &shape);
    layer_page_bytes = (uint64_t)shape.page_tokens * wk_kvshape_token_bytes(&shape);
    region = calloc(shape.layers * POOL_SLOTS, layer_page_bytes);
    wk_kvpool_init(&pool, POOL_SLOTS);
    uint64_t pb = wk_tier_page_bytes(&shape);
    l2_mem = malloc(L2_PAGES * pb);
    if (!region || !l2_mem || wk_l2_create(&l2, l2_mem, L2_PAGES * pb, pb, NULL, NULL) != 0)
        return 2;
    wk_offload_cfg_t oc = {.shape = shape,
                           .l1_base = region,
                           .l1_slots = POOL_SLOTS,
                           .l2 = l2,
                           .lease_drop = lease_drop};
    if (wk_offload_create(&off, &loop, &oc) != 0)
        return 2;
    for (int i = 0; i < SESSIONS; i++) {
        session_t *s = &sess[i];
        s->idx = i;
        s->rng = 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1) + (uint64_t)fault;
        s->cap = 40 + TURNS * (24 + 20) + 64;
        s->ids = malloc(s->cap * sizeof(*s->ids));
        s->n = 40;
        for (uint32_t k = 0; k < s->n; k++) /* a system prompt per group, then the session's */
            s->ids[k] = 100000 + (k < SHARED ? i / GROUP * GROUP : i) * 1000 + k;
        uv_timer_init(&loop, &s->step);
        s->step.data = s;
        uv_timer_init(&loop, &s->room);
        s->room.data = s;
        /* every session at once: hundreds of concurrent requests over 48 slots */
        uv_timer_start(&s->step, start_cb, 0, 0);
    }
    uv_timer_init(&loop, &watchdog);
    uv_timer_start(&watchdog, watchdog_cb, 60000, 0);
    uv_timer_init(&loop, &seen);
    if (fault_on)
        uv_timer_start(&seen, seen_cb, 20, 20);
    uv_run(&loop, UV_RUN_DEFAULT);
    wk_offload_stats_t st;
    wk_offload_stats(off, &st);
    uint64_t corrupt = corrupt_reads + corrupt_l2 + st.bad_copies;
    wk_l2_stats_t l2s;
    wk_l2_stats(l2, &l2s);
    printf("fault=%d sessions_done=%u turns=%" PRIu64 " aborts=%" PRIu64 " offloaded=%" PRIu64
           " skipped=%" PRIu64 " l2_evictions=%" PRIu64 " l2_hits=%" PRIu64
           " corrupt_reads=%" PRIu64 " corrupt_l2=%" PRIu64 " bad_copies=%" PRIu64 "\n",
           fault, finished_sessions, turns_done, aborts, st.pages, st.skipped, l2s.evictions,
           l2_hits, corrupt_reads, corrupt_l2, st.bad_copies);
    if (fault == 0) {
        /* no race: every session through, nothing corrupt, the pool whole again once the
         * offload let go, and the next turns did find offloaded pages */
        int ok = finished_sessions == SESSIONS && corrupt == 0 && l2_hits > 0;
        if (ok) {
            uv_timer_stop(&watchdog);
            wk_offload_close(off, NULL, NULL);
            uv_run(&loop, UV_RUN_DEFAULT);
            ok = pool.n_free == POOL_SLOTS;
            if (!ok)
                printf("pool not whole: %u of %u slots free\n", pool.n_free, POOL_SLOTS);
            /* and every pin the offload took on L2 pages went back through the pool's count */
            uint32_t pinned = 0;
            for (int32_t slot = 0; slot < L2_PAGES; slot++)
                pinned += wk_l2_pins(l2, slot) != 0;
            if (pinned) {
                printf("L2 not released: %u slots still pinned\n", pinned);
                ok = 0;
            }
        }
        return ok ? 0 : 1;
    }
    /* a race re-enabled: the test must see it (the process ends here: leaks are the race's) */
    return corrupt > 0 ? 0 : 1;
}
