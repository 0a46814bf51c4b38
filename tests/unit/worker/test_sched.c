/* test_sched.c — the timing model on virtual time: prefill batches, decode steps, queueing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "baton/error.h"
#include "worker/sched.h"

/* A test sequence: decodes `want` tokens after prefill (regular mode), or leaves after prefill
 * when want == 0. Records when things happened (virtual ns). */
typedef struct tseq_s {
    wk_seq_t seq;
    int id;
    unsigned want, got;
    uint64_t prefilled_at, done_at;
    int prefilled;
    int cancel_other; /* on prefill/decode: cancel this other sequence */
    struct tseq_s *victim;
} tseq_t;

static int prefilled_cb(wk_sched_t *s, wk_seq_t *seq)
{
    tseq_t *t = seq->data;
    assert_int_equal(seq->where, WK_SEQ_IDLE);
    t->prefilled = 1;
    t->prefilled_at = s->step_end;
    if (t->victim)
        wk_sched_cancel(s, &t->victim->seq);
    if (t->want == 0) {
        t->done_at = s->step_end;
        return 0;
    }
    t->got = 1; /* prefill makes the first token */
    if (t->got >= t->want) {
        t->done_at = s->step_end;
        return 0;
    }
    return 1;
}

static int decoded_cb(wk_sched_t *s, wk_seq_t *seq)
{
    tseq_t *t = seq->data;
    t->got++;
    if (t->victim)
        wk_sched_cancel(s, &t->victim->seq);
    if (t->got >= t->want) {
        t->done_at = s->step_end;
        return 0;
    }
    return 1;
}

static void init(wk_sched_t *s, uint64_t prefill_ns, uint64_t decode_ns, unsigned max_batch)
{
    wk_sched_cfg_t cfg = {prefill_ns, decode_ns, max_batch};
    assert_int_equal(wk_sched_init(s, &cfg, prefilled_cb, decoded_cb, NULL), 0);
}

static void tseq(tseq_t *t, int id, uint32_t prompt, unsigned want)
{
    memset(t, 0, sizeof(*t));
    t->id = id;
    t->want = want;
    t->seq.prompt_tokens = prompt;
    t->seq.data = t;
}

/* Polls at increasing virtual times until idle; returns the last step end seen. */
static uint64_t run_until_idle(wk_sched_t *s, uint64_t now)
{
    for (int guard = 0; guard < 100000; guard++) {
        uint64_t next = wk_sched_poll(s, now, 1000);
        if (next == WK_SCHED_IDLE)
            return now;
        if (next > now)
            now = next;
    }
    fail_msg("scheduler never went idle");
    return 0;
}

static void test_init_invalid(void **state)
{
    wk_sched_t s;
    wk_sched_cfg_t cfg = {1, 1, 0};
    assert_int_equal(wk_sched_init(&s, &cfg, prefilled_cb, decoded_cb, NULL), BATON_EINVAL);
}

static void test_prefill_cost_and_batch(void **state)
{
    wk_sched_t s;
    init(&s, 100, 1000, 2); /* 100 ns per prompt token, max 2 per batch */
    tseq_t a, b, c;
    tseq(&a, 1, 10, 0);
    tseq(&b, 2, 5, 0);
    tseq(&c, 3, 7, 0);
    assert_int_equal(wk_sched_poll(&s, 0, 10), WK_SCHED_IDLE);
    wk_sched_submit_prefill(&s, &a.seq);
    wk_sched_submit_prefill(&s, &b.seq);
    wk_sched_submit_prefill(&s, &c.seq);
    assert_int_equal(wk_sched_waiting(&s), 3);
    /* first batch: a and b (15 tokens) from t=1000 */
    assert_int_equal(wk_sched_poll(&s, 1000, 10), 1000 + 1500);
    assert_true(wk_sched_busy(&s));
    assert_int_equal(wk_sched_waiting(&s), 1);
    assert_false(a.prefilled);
    /* not yet */
    assert_int_equal(wk_sched_poll(&s, 2499, 10), 2500);
    assert_false(a.prefilled);
    /* a, b done at 2500; c starts at 2500 (not at "now"), ends 3200 */
    assert_int_equal(wk_sched_poll(&s, 2600, 10), 3200);
    assert_true(a.prefilled && b.prefilled);
    assert_int_equal(a.prefilled_at, 2500);
    assert_false(c.prefilled);
    /* a late poll still completes c at its virtual end */
    assert_int_equal(wk_sched_poll(&s, 10000, 10), WK_SCHED_IDLE);
    assert_int_equal(c.prefilled_at, 3200);
    assert_int_equal(s.prefill_steps, 2);
    assert_int_equal(s.prefill_tokens, 22);
    wk_sched_free(&s);
}

static void test_decode_steps(void **state)
{
    wk_sched_t s;
    init(&s, 0, 1000, 8);
    tseq_t a, b;
    tseq(&a, 1, 4, 3); /* 1 token from prefill + 2 decode steps */
    tseq(&b, 2, 4, 5);
    wk_sched_submit_prefill(&s, &a.seq);
    wk_sched_submit_prefill(&s, &b.seq);
    uint64_t end = run_until_idle(&s, 0);
    (void)end;
    assert_int_equal(a.got, 3);
    assert_int_equal(b.got, 5);
    /* prefill costs 0; every step yields one token for each running sequence */
    assert_int_equal(a.done_at, 2000);
    assert_int_equal(b.done_at, 4000);
    assert_int_equal(s.decode_steps, 4);
    assert_int_equal(s.decode_tokens, 2 + 4);
    wk_sched_free(&s);
}

static void test_max_batch_running(void **state)
{
    /* regular mode: prefill admits only as many as there are free running slots */
    wk_sched_t s;
    init(&s, 0, 1000, 2);
    tseq_t t[3];
    for (int i = 0; i < 3; i++) {
        tseq(&t[i], i, 1, 3);
        wk_sched_submit_prefill(&s, &t[i].seq);
    }
    run_until_idle(&s, 0);
    /* t0, t1 run together (done at 2000); t2 is prefilled only when they leave */
    assert_int_equal(t[0].done_at, 2000);
    assert_int_equal(t[1].done_at, 2000);
    assert_int_equal(t[2].prefilled_at, 2000);
    assert_int_equal(t[2].done_at, 4000);
    wk_sched_free(&s);
}

static void test_ready_queue(void **state)
{
    /* decode mode: sequences arrive ready (first token known) and wait for a slot */
    wk_sched_t s;
    init(&s, 0, 500, 2);
    tseq_t t[3];
    for (int i = 0; i < 3; i++) {
        tseq(&t[i], i, 1, 3);
        t[i].got = 1;
        wk_sched_submit_decode(&s, &t[i].seq);
    }
    assert_int_equal(wk_sched_waiting(&s), 3);
    assert_int_equal(wk_sched_poll(&s, 0, 100), 500);
    assert_int_equal(wk_sched_running(&s), 2);
    assert_int_equal(wk_sched_waiting(&s), 1);
    run_until_idle(&s, 0);
    assert_int_equal(t[0].done_at, 1000);
    assert_int_equal(t[2].done_at, 2000);
    wk_sched_free(&s);
}

static void test_prefill_before_decode(void **state)
{
    wk_sched_t s;
    init(&s, 100, 1000, 4);
    tseq_t a, b;
    tseq(&a, 1, 1, 4);
    tseq(&b, 2, 10, 2);
    wk_sched_submit_prefill(&s, &a.seq);
    assert_int_equal(wk_sched_poll(&s, 0, 100), 100);    /* a's prefill */
    assert_int_equal(wk_sched_poll(&s, 100, 100), 1100); /* a's first decode step */
    wk_sched_submit_prefill(&s, &b.seq);                 /* arrives during the step */
    /* the decode step ends at 1100, then b's prefill goes first (1100..2100) */
    assert_int_equal(wk_sched_poll(&s, 1100, 100), 2100);
    assert_int_equal(s.step_kind, WK_STEP_PREFILL);
    run_until_idle(&s, 2100);
    assert_int_equal(b.prefilled_at, 2100);
    assert_int_equal(a.done_at, 4100);
    assert_int_equal(b.done_at, 3100);
    wk_sched_free(&s);
}

static void test_cancel(void **state)
{
    wk_sched_t s;
    init(&s, 100, 1000, 4);
    tseq_t a, b, c, d;
    tseq(&a, 1, 10, 5);
    tseq(&b, 2, 10, 5);
    tseq(&c, 3, 10, 5);
    tseq(&d, 4, 10, 5);
    wk_sched_submit_prefill(&s, &a.seq);
    wk_sched_submit_prefill(&s, &b.seq);
    /* cancel in the queue */
    wk_sched_cancel(&s, &b.seq);
    assert_int_equal(b.seq.where, WK_SEQ_IDLE);
    assert_int_equal(wk_sched_waiting(&s), 1);
    /* cancel during its step: no callback, the step still ends on time */
    assert_int_equal(wk_sched_poll(&s, 0, 10), 1000);
    wk_sched_cancel(&s, &a.seq);
    assert_int_equal(wk_sched_poll(&s, 1000, 10), WK_SCHED_IDLE);
    assert_false(a.prefilled);
    assert_false(b.prefilled);

    /* a callback cancels a later member of the same step, and one already running */
    tseq(&a, 1, 1, 5);
    tseq(&b, 2, 1, 5);
    tseq(&c, 3, 1, 5);
    a.victim = &c;
    wk_sched_submit_prefill(&s, &a.seq);
    wk_sched_submit_prefill(&s, &b.seq);
    wk_sched_submit_prefill(&s, &c.seq);
    assert_int_equal(wk_sched_poll(&s, 2000, 1), 2300);
    assert_int_equal(wk_sched_poll(&s, 2300, 1), 3300); /* completes prefill, starts decode */
    assert_true(a.prefilled && b.prefilled);
    assert_false(c.prefilled);
    assert_int_equal(c.seq.where, WK_SEQ_IDLE);
    a.victim = NULL;
    b.victim = &a; /* b runs after a in the step: a is already back in the running set */
    assert_int_equal(wk_sched_poll(&s, 3300, 1), 4300);
    assert_int_equal(a.seq.where, WK_SEQ_IDLE);
    assert_int_equal(a.got, 2);
    b.victim = NULL;
    run_until_idle(&s, 4300);
    assert_int_equal(a.got, 2);
    assert_int_equal(b.got, 5);
    wk_sched_cancel(&s, &d.seq); /* never submitted: harmless */
    wk_sched_free(&s);
}

static void test_zero_cost_and_step_budget(void **state)
{
    wk_sched_t s;
    init(&s, 0, 0, 4);
    tseq_t a;
    tseq(&a, 1, 100, 50);
    wk_sched_submit_prefill(&s, &a.seq);
    /* with zero costs every step is due at once; the budget cuts the work into slices */
    uint64_t next = wk_sched_poll(&s, 5, 10);
    assert_true(next <= 5);
    assert_int_equal(a.got, 10); /* prefill + 9 decode steps */
    int polls = 1;
    while (wk_sched_poll(&s, 5, 10) != WK_SCHED_IDLE)
        polls++;
    assert_int_equal(a.got, 50);
    assert_int_equal(a.done_at, 5);
    assert_int_equal(polls, 4); /* 10 + 10 + 10 + 10 tokens, the fifth poll finishes */
    wk_sched_free(&s);
}

/* Layer events: layer k of every step member at start + (k+1)/L of the prefill cost, the last
 * at the step end just before on_prefilled; late polls catch up in order. */
static struct {
    int id[64];
    uint32_t layer[64];
    uint64_t at[64];
    int n;
    wk_seq_t *cancel_on_layer1;
} lev;
static wk_sched_t *lev_sched;

static void layer_cb(wk_sched_t *s, wk_seq_t *seq, uint32_t layer)
{
    tseq_t *t = seq->data;
    assert_false(t->prefilled); /* every layer comes before the end of prefill */
    assert_true(lev.n < 64);
    lev.id[lev.n] = t->id;
    lev.layer[lev.n] = layer;
    lev.at[lev.n] = wk_sched_layer_end(s, layer);
    lev.n++;
    if (layer == 1 && lev.cancel_on_layer1 != NULL && lev.cancel_on_layer1 != seq) {
        wk_sched_cancel(s, lev.cancel_on_layer1);
        lev.cancel_on_layer1 = NULL;
    }
}

static void test_layers(void **state)
{
    wk_sched_t s;
    init(&s, 100, 1000, 4);
    lev_sched = &s;
    memset(&lev, 0, sizeof(lev));
    wk_sched_set_layers(&s, 4, layer_cb);
    tseq_t a, b;
    tseq(&a, 1, 30, 0);
    tseq(&b, 2, 10, 0);
    wk_sched_submit_prefill(&s, &a.seq);
    wk_sched_submit_prefill(&s, &b.seq);
    /* one step of 40 tokens = 4000 ns from t=0: layers end at 1000, 2000, 3000, 4000 */
    assert_int_equal(wk_sched_poll(&s, 0, 10), 1000);
    assert_int_equal(lev.n, 0);
    assert_int_equal(wk_sched_poll(&s, 999, 10), 1000);
    assert_int_equal(wk_sched_poll(&s, 1000, 10), 2000);
    assert_int_equal(lev.n, 2); /* layer 0 of a and b */
    assert_int_equal(lev.layer[0], 0);
    assert_int_equal(lev.layer[1], 0);
    assert_int_equal(lev.at[0], 1000);
    /* a late poll reports layers 1 and 2 in order, then waits for the step end */
    assert_int_equal(wk_sched_poll(&s, 3500, 10), 4000);
    assert_int_equal(lev.n, 6);
    assert_int_equal(lev.layer[2], 1);
    assert_int_equal(lev.layer[4], 2);
    assert_false(a.prefilled);
    assert_int_equal(wk_sched_poll(&s, 4000, 10), WK_SCHED_IDLE);
    assert_int_equal(lev.n, 8);
    assert_int_equal(lev.layer[7], 3);
    assert_int_equal(lev.at[7], 4000);
    assert_true(a.prefilled && b.prefilled);

    /* cancelled inside a layer callback: no more layers, no prefilled */
    memset(&lev, 0, sizeof(lev));
    tseq(&a, 1, 30, 0);
    tseq(&b, 2, 10, 0);
    lev.cancel_on_layer1 = &b.seq;
    wk_sched_submit_prefill(&s, &a.seq);
    wk_sched_submit_prefill(&s, &b.seq);
    run_until_idle(&s, 10000);
    assert_true(a.prefilled);
    assert_false(b.prefilled);
    int b_layers = 0;
    for (int i = 0; i < lev.n; i++)
        b_layers += lev.id[i] == 2;
    assert_true(b_layers <= 2); /* b's layer 0, and its layer 1 only if it came first */

    /* zero cost: every layer at once, still in order, before on_prefilled */
    wk_sched_free(&s);
    init(&s, 0, 0, 4);
    wk_sched_set_layers(&s, 3, layer_cb);
    memset(&lev, 0, sizeof(lev));
    tseq(&a, 1, 5, 0);
    wk_sched_submit_prefill(&s, &a.seq);
    assert_int_equal(wk_sched_poll(&s, 50, 10), WK_SCHED_IDLE);
    assert_int_equal(lev.n, 3);
    assert_true(lev.layer[0] == 0 && lev.layer[1] == 1 && lev.layer[2] == 2);
    assert_true(a.prefilled);
    /* off again: no events */
    wk_sched_set_layers(&s, 3, NULL);
    memset(&lev, 0, sizeof(lev));
    tseq(&a, 1, 5, 0);
    wk_sched_submit_prefill(&s, &a.seq);
    assert_int_equal(wk_sched_poll(&s, 60, 10), WK_SCHED_IDLE);
    assert_int_equal(lev.n, 0);
    wk_sched_free(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_init_invalid), cmocka_unit_test(test_prefill_cost_and_batch),
        cmocka_unit_test(test_decode_steps), cmocka_unit_test(test_max_batch_running),
        cmocka_unit_test(test_ready_queue),  cmocka_unit_test(test_prefill_before_decode),
        cmocka_unit_test(test_cancel),       cmocka_unit_test(test_zero_cost_and_step_budget),
        cmocka_unit_test(test_layers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
