/* test_kvxfer.c — the worker's KV hand-off between a real prefill and a real decode wk_kv_t
 * (libbaton engines on one loop, loopback tcp or shm): the send and receive phase tables, the
 * DONE payload, and every way a room ends (written and verified, mismatch, corruption, either
 * side letting go, a refused room; a held room exported and pulled, timed out or released),
 * checked on the received bytes, the callbacks, the phases, the metrics and the page pools. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "../phase_checks.h"

#include "baton/error.h"
#include "common/buf.h"
#include "loop_test.h"
#include "worker/kvdone.h"
#include "worker/kvpattern.h"
#include "worker/kvxfer_int.h"
#include "worker/simtext.h"

#define LAYERS      4
#define PAGE_TOKENS 16
#define POOL_TOKENS (64 * PAGE_TOKENS)
#define MAX_TOKENS  256

/* ---- the phase tables -------------------------------------------------------------------- */

static void test_send_phases(void **state)
{
    (void)state;
    const wk_kv_phases_t *t = &wk__kv_send_phases;
    assert_int_equal(t->n, WK_SEND_N_PHASES);
    /* the life of a room that worked, request first and offer first */
    static const int ok_paths[][6] = {
        {WK_SEND_NEW, WK_SEND_WAITING, WK_SEND_MATCHED, WK_SEND_FINISHING, WK_SEND_ENDING,
         WK_SEND_CLOSED},
        {WK_SEND_NEW, WK_SEND_ORPHAN, WK_SEND_MATCHED, WK_SEND_FINISHING, WK_SEND_ENDING,
         WK_SEND_CLOSED},
    };
    for (size_t p = 0; p < 2; p++)
        for (int i = 0; i < 5; i++)
            assert_true(wk__kv_phase_legal(t, ok_paths[p][i], ok_paths[p][i + 1]));
    assert_true(wk__kv_phase_legal(t, WK_SEND_WAITING, WK_SEND_TOMB));
    assert_true(wk__kv_phase_legal(t, WK_SEND_MATCHED, WK_SEND_DROPPED));
    assert_true(wk__kv_phase_legal(t, WK_SEND_DROPPED, WK_SEND_CLOSED));
    /* terminal phases go nowhere; nothing returns to NEW; no skipping the match */
    for (unsigned to = 0; to < WK_SEND_N_PHASES; to++) {
        assert_false(wk__kv_phase_legal(t, WK_SEND_CLOSED, to));
        assert_false(wk__kv_phase_legal(t, WK_SEND_TOMB, to));
        assert_false(wk__kv_phase_legal(t, to, WK_SEND_NEW));
    }
    assert_false(wk__kv_phase_legal(t, WK_SEND_WAITING, WK_SEND_FINISHING));
    assert_false(wk__kv_phase_legal(t, WK_SEND_ORPHAN, WK_SEND_DROPPED));
    assert_false(wk__kv_phase_legal(t, WK_SEND_DROPPED, WK_SEND_MATCHED));
    assert_false(wk__kv_phase_legal(t, WK_SEND_N_PHASES, WK_SEND_CLOSED));
    /* the one mover refuses an illegal move and leaves the phase as it was */
    wk_kv_send_t s;
    memset(&s, 0, sizeof(s));
    assert_int_equal(wk__kv_send_to(&s, WK_SEND_MATCHED), BATON_EINVAL);
    assert_int_equal(s.phase, WK_SEND_NEW);
    assert_int_equal(wk__kv_send_to(&s, WK_SEND_WAITING), 0);
    assert_int_equal(s.phase, WK_SEND_WAITING);
    assert_int_equal(wk__kv_send_to(&s, WK_SEND_CLOSED), BATON_EINVAL);
    assert_int_equal(s.phase, WK_SEND_WAITING);
    assert_string_equal(wk__kv_phase_name(t, WK_SEND_FINISHING), "finishing");
    assert_string_equal(wk__kv_phase_name(t, 99), "?");
}

static void test_recv_phases(void **state)
{
    (void)state;
    const wk_kv_phases_t *t = &wk__kv_recv_phases;
    assert_true(wk__kv_phase_legal(t, WK_RECV_NEW, WK_RECV_OFFERED));
    assert_true(wk__kv_phase_legal(t, WK_RECV_OFFERED, WK_RECV_CHECKING));
    assert_true(wk__kv_phase_legal(t, WK_RECV_CHECKING, WK_RECV_GOT));
    assert_true(wk__kv_phase_legal(t, WK_RECV_GOT, WK_RECV_ENDED));
    assert_true(wk__kv_phase_legal(t, WK_RECV_OFFERED, WK_RECV_ABORTING));
    assert_true(wk__kv_phase_legal(t, WK_RECV_ABORTING, WK_RECV_ENDED));
    /* a verdict needs DONE first; an aborted room never reports success */
    assert_false(wk__kv_phase_legal(t, WK_RECV_OFFERED, WK_RECV_GOT));
    assert_false(wk__kv_phase_legal(t, WK_RECV_ABORTING, WK_RECV_GOT));
    assert_false(wk__kv_phase_legal(t, WK_RECV_CHECKING, WK_RECV_ABORTING));
    for (unsigned to = 0; to < WK_RECV_N_PHASES; to++)
        assert_false(wk__kv_phase_legal(t, WK_RECV_ENDED, to));
    wk_kv_recv_t r;
    memset(&r, 0, sizeof(r));
    assert_int_equal(wk__kv_recv_to(&r, WK_RECV_CHECKING), BATON_EINVAL);
    assert_int_equal(r.phase, WK_RECV_NEW);
    assert_int_equal(wk__kv_recv_to(&r, WK_RECV_OFFERED), 0);
    assert_int_equal(r.phase, WK_RECV_OFFERED);
}

/* ---- the DONE payload -------------------------------------------------------------------- */

static void test_kvdone(void **state)
{
    (void)state;
    wk_kvdone_t in = {37, 32, 131072, 16, 0x779a65e7023cd2e7ull, 1, 16, 32, 48}, out;
    uint8_t buf[WK_KVDONE_LEN];
    wk_kvdone_encode(&in, buf);
    /* little-endian on the wire, whatever the host */
    assert_int_equal(buf[0], 0x42);
    assert_int_equal(buf[3], 0x56);
    assert_int_equal(buf[8], 37);
    assert_int_equal(buf[32], 0xe7);
    memset(&out, 0, sizeof(out));
    assert_int_equal(wk_kvdone_decode(buf, sizeof(buf), &out), 0);
    assert_int_equal(out.n_tokens, 37);
    assert_int_equal(out.layers, 32);
    assert_int_equal(out.token_bytes, 131072);
    assert_int_equal(out.page_tokens, 16);
    assert_int_equal(out.seed, in.seed);
    /* the prefill's tier hits ride behind the first 40 bytes */
    assert_true(out.has_hits);
    assert_int_equal(out.hit_l1, 16);
    assert_int_equal(out.hit_l2, 32);
    assert_int_equal(out.hit_l3, 48);
    /* an older prefill's 40 bytes still decode, without hits */
    memset(&out, 0, sizeof(out));
    assert_int_equal(wk_kvdone_decode(buf, WK_KVDONE_LEN_MIN, &out), 0);
    assert_int_equal(out.seed, in.seed);
    assert_false(out.has_hits);
    assert_int_equal(out.hit_l3, 0);
    assert_int_equal(wk_kvdone_decode(buf, WK_KVDONE_LEN_MIN - 1, &out), -1);
    assert_int_equal(wk_kvdone_decode(NULL, 0, &out), -1);
    buf[4] ^= 1; /* version */
    assert_int_equal(wk_kvdone_decode(buf, sizeof(buf), &out), -1);
    buf[4] ^= 1;
    buf[0] ^= 1; /* magic */
    assert_int_equal(wk_kvdone_decode(buf, sizeof(buf), &out), -1);
}

/* ---- two engines on one loop ------------------------------------------------------------- */

typedef struct room_s {
    uint64_t id;
    int64_t ids[MAX_TOKENS];
    uint32_t n_tokens;
    uint64_t seed;
    uint32_t cached; /* decode: tokens its prefix cache holds (whole pages are not offered) */
    /* prefill */
    wk_kv_send_t *s;
    int matched, sent;
    int sent_status;
    char sent_detail[256];
    /* decode */
    wk_kv_recv_t *r;
    uint32_t slots[MAX_TOKENS / PAGE_TOKENS];
    int got;
    int got_status;
    wk_kv_got_t g;
    char got_detail[256];
} room_t;

static struct {
    uv_loop_t loop;
    uv_timer_t keepalive;
    baton_metrics_t *pm, *dm;
    wk_kv_t *p, *d;
    int closed;
} E;

#define RUN_UNTIL(cond) LOOP_RUN_UNTIL(&E.loop, cond)

static wk_kv_cfg_t kv_cfg(int prefill, baton_xfer_transport_t tp)
{
    wk_kv_cfg_t c;
    memset(&c, 0, sizeof(c));
    c.prefill = prefill;
    c.listen_host = "127.0.0.1";
    c.listen_port = 0;
    c.shape = (wk_kvshape_t){LAYERS, 2, 16, 2, PAGE_TOKENS};
    c.pool_tokens = POOL_TOKENS;
    c.transports[0] = tp;
    c.n_transports = 1;
    c.timeout_ms = 5000;
    return c;
}

static void engines_up(baton_xfer_transport_t tp, uint32_t corrupt_every)
{
    memset(&E, 0, sizeof(E));
    assert_int_equal(uv_loop_init(&E.loop), 0);
    loop_test_keepalive(&E.loop, &E.keepalive);
    E.pm = baton_metrics_create();
    E.dm = baton_metrics_create();
    assert_non_null(E.pm);
    assert_non_null(E.dm);
    wk_kv_cfg_t pc = kv_cfg(1, tp), dc = kv_cfg(0, tp);
    pc.fault_corrupt_every = corrupt_every;
    assert_int_equal(wk_kv_create(&E.p, &E.loop, &pc, E.pm), 0);
    assert_int_equal(wk_kv_create(&E.d, &E.loop, &dc, E.dm), 0);
    assert_true(wk_kv_listen_port(E.p) > 0);
    assert_int_equal(wk_kv_pool_slots(E.p), POOL_TOKENS / PAGE_TOKENS);
}

static void on_kv_closed(void *arg)
{
    (void)arg;
    E.closed++;
}

/* Every slot back in both pools, both engines closed, nothing left on the loop. */
static void engines_down(void)
{
    RUN_UNTIL(E.p->pool.n_free == E.p->n_slots && E.d->pool.n_free == E.d->n_slots);
    wk_kv_close(E.p, on_kv_closed, NULL);
    wk_kv_close(E.d, on_kv_closed, NULL);
    RUN_UNTIL(E.closed == 2);
    uv_close((uv_handle_t *)&E.keepalive, NULL);
    uv_run(&E.loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&E.loop), 0);
    baton_metrics_destroy(E.pm);
    baton_metrics_destroy(E.dm);
}

static void room_init(room_t *rm, uint64_t id, uint32_t n_tokens)
{
    memset(rm, 0, sizeof(*rm));
    rm->id = id;
    rm->n_tokens = n_tokens;
    for (uint32_t i = 0; i < n_tokens; i++)
        rm->ids[i] = (int64_t)(id * 1000 + i * 7 + 1);
    rm->seed = wk_sim_seed_ids(rm->ids, n_tokens);
}

static wk_kv_prompt_t prompt_of(const room_t *rm)
{
    wk_kv_prompt_t pr = {rm->ids, rm->n_tokens, rm->seed, 1, rm->cached, 0};
    return pr;
}

static void on_matched(void *data)
{
    ((room_t *)data)->matched++;
}

static void on_sent(void *data, int status, const char *detail)
{
    room_t *rm = data;
    rm->sent++;
    rm->sent_status = status;
    snprintf(rm->sent_detail, sizeof(rm->sent_detail), "%s", detail);
    rm->s = NULL; /* gone after this callback */
}

static void on_received(void *data, int status, const wk_kv_got_t *got, const char *detail)
{
    room_t *rm = data;
    rm->got++;
    rm->got_status = status;
    if (got)
        rm->g = *got;
    snprintf(rm->got_detail, sizeof(rm->got_detail), "%s", detail);
    if (status != 0)
        rm->r = NULL; /* gone with the failure */
}

static void send_open(room_t *rm)
{
    wk_kv_prompt_t pr = prompt_of(rm);
    assert_int_equal(wk_kv_send_open(E.p, rm->id, &pr, on_matched, on_sent, rm, &rm->s), 0);
    assert_int_equal(rm->matched, 0); /* never inside the call */
}

/* The decode's pages for rm, offered to the prefill (or pulled from its export). */
static void recv_begin(room_t *rm, int pull)
{
    wk_kv_prompt_t pr = prompt_of(rm);
    pr.pull = pull;
    wk_kv_resv_t resv;
    uint32_t n = wk_kv_slots_for(E.d, rm->n_tokens);
    assert_int_equal(wk_kv_reserve(E.d, &resv, n, rm->slots, NULL, NULL), 0);
    assert_int_equal(wk_kv_recv_start(E.d, "127.0.0.1", wk_kv_listen_port(E.p), rm->id, &pr,
                                      rm->slots, on_received, rm, &rm->r),
                     0);
    assert_int_equal(rm->r->phase, WK_RECV_OFFERED);
    assert_int_equal(rm->got, 0);
}

static void recv_start(room_t *rm)
{
    recv_begin(rm, 0);
}

/* After the match: the prefill's pages, then every layer computed (written as it is, when
 * layerwise), then the end of compute with the first token. */
static void prefill_compute(room_t *rm, int layerwise)
{
    uint32_t n = wk_kv_slots_for(E.p, rm->n_tokens);
    uint32_t src[MAX_TOKENS / PAGE_TOKENS];
    wk_kv_resv_t resv;
    assert_int_equal(rm->s->phase, WK_SEND_MATCHED);
    assert_int_equal(wk_kv_reserve(E.p, &resv, n, src, NULL, NULL), 0);
    assert_int_equal(wk_kv_send_slots(rm->s, src), 0);
    for (uint32_t l = 0; l < LAYERS; l++)
        wk_kv_send_layer(rm->s, l, layerwise);
    wk_kv_send_finish(rm->s, wk_sim_token(rm->seed, 0));
    if (rm->s != NULL) /* DONE may be out already when every fill ended */
        assert_true(rm->s->phase == WK_SEND_FINISHING || rm->s->phase == WK_SEND_ENDING);
}

/* The decode's pages hold exactly what the prefill computed for this prompt. */
static void assert_pages_hold(const room_t *rm)
{
    uint32_t ppl = wk_kv_slots_for(E.d, rm->n_tokens);
    for (uint32_t l = 0; l < LAYERS; l++)
        for (uint32_t j = 0; j < ppl; j++) {
            uint32_t first = j * PAGE_TOKENS;
            uint32_t n = wk_kvshape_page_tokens_at(&E.d->cfg.shape, rm->n_tokens, j);
            uint64_t off = 0;
            assert_int_equal(wk_kv_check(wk__kv_page_addr(E.d, l, rm->slots[j]), E.d->token_bytes,
                                         rm->ids + first, first, n, l, &off),
                             0);
        }
}

static void handoff(baton_xfer_transport_t tp, int request_first, int layerwise)
{
    engines_up(tp, 0);
    room_t rm;
    room_init(&rm, 42, 37); /* 3 pages a layer, the last one short */
    if (request_first) {
        send_open(&rm);
        assert_int_equal(rm.s->phase, WK_SEND_WAITING);
        recv_start(&rm);
    } else {
        recv_start(&rm);
        RUN_UNTIL(baton_u64map_get(&E.p->rooms, rm.id) != NULL);
        wk_kv_send_t *orphan = baton_u64map_get(&E.p->rooms, rm.id);
        assert_int_equal(orphan->phase, WK_SEND_ORPHAN);
        send_open(&rm);
        assert_ptr_equal(rm.s, orphan);
    }
    RUN_UNTIL(rm.matched);
    prefill_compute(&rm, layerwise);
    RUN_UNTIL(rm.sent && rm.got);
    assert_int_equal(rm.matched, 1);
    assert_int_equal(rm.sent_status, 0);
    assert_int_equal(rm.got_status, 0);
    assert_int_equal(rm.g.prompt_tokens, 37);
    assert_int_equal(rm.g.seed, rm.seed);
    assert_int_equal(rm.g.first_token, wk_sim_token(rm.seed, 0));
    assert_int_equal(rm.r->phase, WK_RECV_GOT);
    assert_pages_hold(&rm);
    /* the pages stay the request's until it lets go */
    uint32_t ppl = wk_kv_slots_for(E.d, rm.n_tokens);
    assert_int_equal(E.d->pool.n_free, E.d->n_slots - ppl);
    wk_kv_recv_drop(rm.r, "done");
    RUN_UNTIL(E.d->pool.n_free == E.d->n_slots);
    assert_int_equal(loop_test_metric(E.pm, "baton_kv_rooms_total{result=\"ok\"}"), 1);
    assert_int_equal(loop_test_metric(E.dm, "baton_kv_rooms_total{result=\"ok\"}"), 1);
    assert_int_equal(loop_test_metric(E.dm, "baton_kv_rooms_total{result=\"failed\"}"), 0);
    assert_int_equal(baton_u64map_get(&E.p->rooms, rm.id), NULL); /* closed rooms leave */
    engines_down();
}

static void test_handoff_tcp_request_first(void **state)
{
    (void)state;
    handoff(BATON_XFER_TRANSPORT_TCP, 1, 1);
}

static void test_handoff_tcp_offer_first_whole_room(void **state)
{
    (void)state;
    handoff(BATON_XFER_TRANSPORT_TCP, 0, 0);
}

static void test_handoff_shm(void **state)
{
    (void)state;
    handoff(BATON_XFER_TRANSPORT_SHM, 1, 1);
}

/*
 * A follow-up turn: the decode's cache holds the first 32 of 37 tokens, so the first 2 of the 3
 * pages of every layer are not offered. Only the last page of each layer travels (the bytes
 * counted on both sides), the skipped pages are counted on both sides, and the decode's pages
 * still hold the whole prompt's KV (the cached ones restored, the received one verified).
 */
static void partial_handoff(baton_xfer_transport_t tp, uint32_t corrupt_every)
{
    engines_up(tp, corrupt_every);
    room_t rm;
    room_init(&rm, 43, 37);
    rm.cached = 32 + 3; /* a partly cached page is sent whole */
    send_open(&rm);
    recv_start(&rm);
    assert_int_equal(rm.r->p.first_page, 2);
    RUN_UNTIL(rm.matched);
    prefill_compute(&rm, 1);
    RUN_UNTIL(rm.sent && rm.got);
    assert_int_equal(rm.sent_status, 0);
    assert_int_equal(loop_test_metric(E.dm, "baton_kv_pages_skipped_total"), 2 * LAYERS);
    assert_int_equal(loop_test_metric(E.pm, "baton_kv_pages_skipped_total"), 2 * LAYERS);
    if (corrupt_every) {
        /* the corrupted byte is in the first page that travels, and is caught there */
        assert_int_equal(rm.got_status, BATON_EKVCORRUPT);
        assert_non_null(strstr(rm.got_detail, "at layer 3, page 2"));
        engines_down();
        return;
    }
    assert_int_equal(rm.got_status, 0);
    assert_int_equal(rm.g.first_token, wk_sim_token(rm.seed, 0));
    assert_pages_hold(&rm);
    wk_kv_recv_drop(rm.r, "done");
    RUN_UNTIL(E.d->pool.n_free == E.d->n_slots);
    wk_kv_metrics_sync(E.d);
    wk_kv_metrics_sync(E.p);
    uint64_t moved = (uint64_t)LAYERS * (37 - 32) * E.d->token_bytes; /* the last page only */
    assert_int_equal(loop_test_metric(E.dm, "baton_kv_bytes_total{direction=\"received\"}"), moved);
    assert_int_equal(loop_test_metric(E.pm, "baton_kv_bytes_total{direction=\"sent\"}"), moved);
    engines_down();
}

static void test_partial_handoff_tcp(void **state)
{
    (void)state;
    partial_handoff(BATON_XFER_TRANSPORT_TCP, 0);
}

static void test_partial_handoff_shm(void **state)
{
    (void)state;
    partial_handoff(BATON_XFER_TRANSPORT_SHM, 0);
}

static void test_partial_handoff_corrupt(void **state)
{
    (void)state;
    partial_handoff(BATON_XFER_TRANSPORT_TCP, 1);
}

/* The decode offers pages for 5 tokens, the prefill's request has 37: the prefill refuses the
 * offer in its DONE (nothing written) and both sides report a mismatch. */
static void test_shape_mismatch(void **state)
{
    (void)state;
    engines_up(BATON_XFER_TRANSPORT_TCP, 0);
    room_t dec, pre;
    room_init(&dec, 7, 5);
    room_init(&pre, 7, 37);
    recv_start(&dec);
    send_open(&pre);
    RUN_UNTIL(pre.sent && dec.got);
    assert_int_equal(pre.matched, 0); /* a refused offer is never handed to compute */
    assert_int_equal(pre.sent_status, WK_EMISMATCH);
    assert_non_null(strstr(pre.sent_detail, "offer has 4 layers x 1 pages, prefill needs 4 x 3"));
    assert_int_equal(dec.got_status, WK_EMISMATCH);
    assert_non_null(strstr(dec.got_detail, "prefill computed 37 prompt tokens"));
    assert_int_equal(loop_test_metric(E.pm, "baton_kv_room_failures_total{reason=\"mismatch\"}"),
                     1);
    assert_int_equal(loop_test_metric(E.dm, "baton_kv_room_failures_total{reason=\"mismatch\"}"),
                     1);
    engines_down();
}

/* A partial offer is still checked against the whole shape: the decode skips its cached first
 * page of 3, the prefill's request needs 2 pages a layer, and the offer is refused as before. */
static void test_partial_shape_mismatch(void **state)
{
    (void)state;
    engines_up(BATON_XFER_TRANSPORT_TCP, 0);
    room_t dec, pre;
    room_init(&dec, 8, 37);
    dec.cached = 16;
    room_init(&pre, 8, 20);
    recv_start(&dec);
    send_open(&pre);
    RUN_UNTIL(pre.sent && dec.got);
    assert_int_equal(pre.matched, 0);
    assert_int_equal(pre.sent_status, WK_EMISMATCH);
    assert_non_null(strstr(pre.sent_detail, "offer has 4 layers x 3 pages, prefill needs 4 x 2"));
    assert_int_equal(dec.got_status, WK_EMISMATCH);
    engines_down();
}

/* A prefill that corrupts one byte of the room: the decode's check finds it. */
static void test_corrupt(void **state)
{
    (void)state;
    engines_up(BATON_XFER_TRANSPORT_TCP, 1);
    room_t rm;
    room_init(&rm, 9, 20);
    send_open(&rm);
    recv_start(&rm);
    RUN_UNTIL(rm.matched);
    prefill_compute(&rm, 1);
    RUN_UNTIL(rm.sent && rm.got);
    assert_int_equal(rm.sent_status, 0); /* every write landed: the prefill cannot tell */
    assert_int_equal(rm.got_status, BATON_EKVCORRUPT);
    assert_non_null(strstr(rm.got_detail, "at layer 3, page 0"));
    assert_int_equal(loop_test_metric(E.dm, "baton_kv_corrupted_total"), 1);
    engines_down();
}

/* The decode lets go before the prefill's request came: the prefill remembers the room, so the
 * late request fails at once instead of waiting for its deadline. */
static void test_decode_drops_first(void **state)
{
    (void)state;
    engines_up(BATON_XFER_TRANSPORT_TCP, 0);
    room_t rm;
    room_init(&rm, 11, 8);
    recv_start(&rm);
    RUN_UNTIL(baton_u64map_get(&E.p->rooms, rm.id) != NULL);
    wk_kv_recv_t *r = rm.r;
    wk_kv_recv_drop(r, "timeout");
    assert_int_equal(r->phase, WK_RECV_ABORTING); /* the pages wait for the offer's end */
    RUN_UNTIL(((wk_kv_send_t *)baton_u64map_get(&E.p->rooms, rm.id))->phase == WK_SEND_TOMB);
    RUN_UNTIL(E.d->pool.n_free == E.d->n_slots);
    assert_int_equal(rm.got, 0); /* no callback after a drop */
    wk_kv_prompt_t pr = prompt_of(&rm);
    wk_kv_send_t *s = NULL;
    assert_int_equal(wk_kv_send_open(E.p, rm.id, &pr, on_matched, on_sent, &rm, &s),
                     BATON_EABORTED);
    assert_int_equal(loop_test_metric(E.dm, "baton_kv_room_failures_total{reason=\"timeout\"}"), 1);
    assert_int_equal(loop_test_metric(E.pm, "baton_kv_room_failures_total{reason=\"aborted\"}"), 1);
    engines_down();
}

/* The prefill refused the room's request (queue full): the decode's offer fails fast. */
static void test_refused_room(void **state)
{
    (void)state;
    engines_up(BATON_XFER_TRANSPORT_TCP, 0);
    room_t rm;
    room_init(&rm, 13, 8);
    wk_kv_send_refuse(E.p, rm.id);
    assert_int_equal(((wk_kv_send_t *)baton_u64map_get(&E.p->rooms, rm.id))->phase, WK_SEND_TOMB);
    recv_start(&rm);
    RUN_UNTIL(rm.got);
    assert_int_equal(rm.got_status, BATON_EABORTED);
    assert_null(rm.r);
    wk_kv_prompt_t pr = prompt_of(&rm);
    wk_kv_send_t *s = NULL;
    assert_int_equal(wk_kv_send_open(E.p, rm.id, &pr, on_matched, on_sent, &rm, &s),
                     BATON_EABORTED);
    engines_down();
}

/* The prefill's request lets go after the match: the decode learns at once; no `sent`. */
static void test_prefill_drops_after_match(void **state)
{
    (void)state;
    engines_up(BATON_XFER_TRANSPORT_TCP, 0);
    room_t rm;
    room_init(&rm, 17, 40);
    send_open(&rm);
    recv_start(&rm);
    RUN_UNTIL(rm.matched);
    wk_kv_send_t *s = rm.s;
    wk_kv_send_drop(s, "canceled");
    assert_int_equal(s->phase, WK_SEND_DROPPED);
    wk_kv_send_drop(s, "canceled"); /* a second drop changes nothing */
    assert_int_equal(s->phase, WK_SEND_DROPPED);
    RUN_UNTIL(rm.got);
    assert_int_equal(rm.got_status, BATON_EABORTED);
    assert_int_equal(rm.sent, 0);
    assert_int_equal(loop_test_metric(E.pm, "baton_kv_room_failures_total{reason=\"canceled\"}"),
                     1);
    engines_down();
}

/* A second request for a room already open here is refused; the first one goes on. */
static void test_room_in_use(void **state)
{
    (void)state;
    engines_up(BATON_XFER_TRANSPORT_TCP, 0);
    room_t a, b;
    room_init(&a, 21, 8);
    room_init(&b, 21, 8);
    send_open(&a);
    wk_kv_prompt_t pr = prompt_of(&b);
    assert_int_equal(wk_kv_send_open(E.p, b.id, &pr, on_matched, on_sent, &b, &b.s), BATON_EEXIST);
    wk_kv_send_drop(a.s, "canceled");
    assert_int_equal(((wk_kv_send_t *)baton_u64map_get(&E.p->rooms, a.id))->phase, WK_SEND_TOMB);
    engines_down();
}

static void on_probe_closed(uv_handle_t *h)
{
    *(int *)h->data = 1;
}

/* A port nothing listens on (bound, read, closed again). */
static int dead_port(void)
{
    uv_tcp_t s; /* lives until its close callback: the loop runs until then */
    struct sockaddr_in a;
    struct sockaddr_storage got;
    int len = sizeof(got), closed = 0;
    uv_ip4_addr("127.0.0.1", 0, &a);
    assert_int_equal(uv_tcp_init(&E.loop, &s), 0);
    s.data = &closed;
    assert_int_equal(uv_tcp_bind(&s, (const struct sockaddr *)&a, 0), 0);
    assert_int_equal(uv_tcp_getsockname(&s, (struct sockaddr *)&got, &len), 0);
    uv_close((uv_handle_t *)&s, on_probe_closed);
    RUN_UNTIL(closed);
    return ntohs(((struct sockaddr_in *)&got)->sin_port);
}

/* The decode's prefill never answered: WK_EUNREACHABLE, not a lost peer, and the pages come back.
 */
static void test_unreachable(void **state)
{
    (void)state;
    engines_up(BATON_XFER_TRANSPORT_TCP, 0);
    room_t rm;
    room_init(&rm, 23, 8);
    wk_kv_prompt_t pr = prompt_of(&rm);
    wk_kv_resv_t resv;
    assert_int_equal(wk_kv_reserve(E.d, &resv, 1, rm.slots, NULL, NULL), 0);
    assert_int_equal(wk_kv_recv_start(E.d, "127.0.0.1", dead_port(), rm.id, &pr, rm.slots,
                                      on_received, &rm, &rm.r),
                     0);
    RUN_UNTIL(rm.got);
    assert_int_equal(rm.got_status, WK_EUNREACHABLE);
    assert_null(rm.r);
    assert_int_equal(loop_test_metric(E.dm, "baton_kv_room_failures_total{reason=\"unreachable\"}"),
                     1);
    /* bad arguments are refused at once and the slots stay the caller's */
    wk_kv_recv_t *r = NULL;
    assert_int_equal(wk_kv_recv_start(E.d, "", 1, 24, &pr, rm.slots, on_received, &rm, &r),
                     BATON_EINVAL);
    assert_int_equal(
        wk_kv_recv_start(E.d, "127.0.0.1", 70000, 24, &pr, rm.slots, on_received, &rm, &r),
        BATON_EINVAL);
    assert_null(r);
    engines_down();
}

/* ---- pull mode: the holder's export (vllm-nixl prefill) and the decode's pull ---- */

static struct {
    int ready, ready_status, ended, end_status;
} X;

static void on_export_ready(void *data, int status)
{
    (void)data;
    X.ready++;
    X.ready_status = status;
}

static void on_export_end(void *data, int status)
{
    (void)data;
    X.ended++;
    X.end_status = status;
}

/* Reserves the holder's pages for rm and exports them; returns the handle once ready. */
static wk_kv_export_t *export_room(const room_t *rm, uint32_t timeout_ms)
{
    uint32_t src[MAX_TOKENS / PAGE_TOKENS];
    wk_kv_resv_t resv;
    assert_int_equal(wk_kv_reserve(E.p, &resv, wk_kv_slots_for(E.p, rm->n_tokens), src, NULL, NULL),
                     0);
    wk_kv_prompt_t pr = prompt_of(rm);
    wk_kv_export_t *ex = NULL;
    memset(&X, 0, sizeof(X));
    assert_int_equal(wk_kv_export_start(E.p, rm->id, &pr, src, wk_sim_token(rm->seed, 0),
                                        timeout_ms, on_export_ready, on_export_end, NULL, &ex),
                     0);
    assert_int_equal(X.ready, 0); /* never inside the call */
    return ex;
}

static void pull_start(room_t *rm)
{
    recv_begin(rm, 1);
}

static void export_pull(baton_xfer_transport_t tp)
{
    engines_up(tp, 0);
    room_t rm;
    room_init(&rm, 77, 37);
    rm.cached = 32; /* a pull ignores the decode's cache: every page comes from the export */
    export_room(&rm, 5000);
    RUN_UNTIL(X.ready);
    assert_int_equal(X.ready_status, 0);
    assert_int_equal(X.ended, 0);
    pull_start(&rm);
    RUN_UNTIL(rm.got && X.ended);
    assert_int_equal(rm.got_status, 0);
    assert_int_equal(X.end_status, 0);
    assert_int_equal(rm.g.seed, rm.seed);
    assert_int_equal(rm.g.first_token, wk_sim_token(rm.seed, 0));
    assert_pages_hold(&rm);
    assert_int_equal(loop_test_metric(E.pm, "baton_kv_rooms_total{result=\"ok\"}"), 1);
    assert_int_equal(loop_test_metric(E.dm, "baton_kv_pages_skipped_total"), 0);
    RUN_UNTIL(E.p->pool.n_free == E.p->n_slots); /* the export's pages are back */
    wk_kv_recv_drop(rm.r, "done");
    engines_down();
}

static void test_export_pull_tcp(void **state)
{
    (void)state;
    export_pull(BATON_XFER_TRANSPORT_TCP);
}

static void test_export_pull_shm(void **state)
{
    (void)state;
    export_pull(BATON_XFER_TRANSPORT_SHM);
}

/* An export ends by its timeout or a release (before or after it is ready); each time the pages
 * come back and a later pull of the key is refused at once. */
static void test_export_timeout_and_release(void **state)
{
    (void)state;
    engines_up(BATON_XFER_TRANSPORT_TCP, 0);
    room_t rm;
    room_init(&rm, 78, 20);
    export_room(&rm, 30);
    RUN_UNTIL(X.ended);
    assert_int_equal(X.ready_status, 0);
    assert_int_equal(X.end_status, BATON_ETIMEOUT);
    assert_int_equal(loop_test_metric(E.pm, "baton_kv_room_failures_total{reason=\"timeout\"}"), 1);
    pull_start(&rm);
    RUN_UNTIL(rm.got);
    assert_int_equal(rm.got_status, BATON_EABORTED);

    room_init(&rm, 79, 20);
    wk_kv_export_t *ex = export_room(&rm, 0);
    RUN_UNTIL(X.ready);
    /* (the refused late pull above counted one "aborted" room already) */
    double aborted = loop_test_metric(E.pm, "baton_kv_room_failures_total{reason=\"aborted\"}");
    assert_int_equal(wk_kv_export_release(ex, 0, "aborted"), 0);
    assert_int_equal(loop_test_metric(E.pm, "baton_kv_room_failures_total{reason=\"aborted\"}"),
                     aborted + 1);
    pull_start(&rm);
    RUN_UNTIL(rm.got);
    assert_int_equal(rm.got_status, BATON_EABORTED);

    room_init(&rm, 80, 20);
    ex = export_room(&rm, 0);
    assert_int_equal(wk_kv_export_release(ex, 1, "failed"), 0); /* still filling */
    RUN_UNTIL(E.p->pool.n_free == E.p->n_slots);
    assert_int_equal(X.ready + X.ended, 0); /* no callback after a release */
    engines_down();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_send_phases),
        cmocka_unit_test(test_recv_phases),
        cmocka_unit_test(test_refused_count_starts),
        cmocka_unit_test(test_kvdone),
        cmocka_unit_test(test_handoff_tcp_request_first),
        cmocka_unit_test(test_handoff_tcp_offer_first_whole_room),
        cmocka_unit_test(test_handoff_shm),
        cmocka_unit_test(test_partial_handoff_tcp),
        cmocka_unit_test(test_partial_handoff_shm),
        cmocka_unit_test(test_partial_handoff_corrupt),
        cmocka_unit_test(test_shape_mismatch),
        cmocka_unit_test(test_partial_shape_mismatch),
        cmocka_unit_test(test_corrupt),
        cmocka_unit_test(test_decode_drops_first),
        cmocka_unit_test(test_refused_room),
        cmocka_unit_test(test_prefill_drops_after_match),
        cmocka_unit_test(test_room_in_use),
        cmocka_unit_test(test_unreachable),
        cmocka_unit_test(test_export_pull_tcp),
        cmocka_unit_test(test_export_pull_shm),
        cmocka_unit_test(test_export_timeout_and_release),
        cmocka_unit_test(test_no_refused_phase_moves),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
