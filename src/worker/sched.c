/* sched.c — prefill/decode step scheduler on a virtual timeline (see sched.h). */
#include "worker/sched.h"

#include <stdlib.h>
#include <string.h>

#include "baton/error.h"

static void list_push(wk_seq_list_t *l, wk_seq_t *seq)
{
    baton_list_push(&l->q, &seq->link);
    l->n++;
}

static void list_remove(wk_seq_list_t *l, wk_seq_t *seq)
{
    baton_list_remove(&seq->link);
    l->n--;
}

static wk_seq_t *list_pop(wk_seq_list_t *l)
{
    baton_list_t *first = baton_list_first(&l->q);
    if (first == NULL)
        return NULL;
    wk_seq_t *seq = container_of(first, wk_seq_t, link);
    list_remove(l, seq);
    return seq;
}

static uint64_t sat_mul(uint64_t a, uint64_t b)
{
    if (a != 0 && b > UINT64_MAX / a)
        return UINT64_MAX;
    return a * b;
}

static uint64_t sat_add(uint64_t a, uint64_t b)
{
    return a > UINT64_MAX - b ? UINT64_MAX - 1 : a + b;
}

int wk_sched_init(wk_sched_t *s, const wk_sched_cfg_t *cfg, wk_sched_prefilled_cb on_prefilled,
                  wk_sched_decoded_cb on_decoded, void *data)
{
    memset(s, 0, sizeof(*s));
    baton_list_init(&s->prefill_q.q);
    baton_list_init(&s->ready_q.q);
    baton_list_init(&s->running.q);
    if (cfg->max_batch == 0)
        return BATON_EINVAL;
    s->cfg = *cfg;
    s->on_prefilled = on_prefilled;
    s->on_decoded = on_decoded;
    s->data = data;
    s->step = calloc(cfg->max_batch, sizeof(*s->step));
    if (s->step == NULL)
        return BATON_ENOMEM;
    return 0;
}

void wk_sched_set_layers(wk_sched_t *s, uint32_t layers, wk_sched_layer_cb cb)
{
    s->on_layer = layers >= 1 ? cb : NULL;
    s->layers = s->on_layer ? layers : 0;
}

uint64_t wk_sched_layer_end(const wk_sched_t *s, uint32_t layer)
{
    uint32_t n = s->layers ? s->layers : 1;
    if (layer + 1 >= n)
        return s->step_end;
    uint64_t cost = s->step_end - s->step_start;
    /* start + cost * (layer + 1) / n without overflowing */
    return s->step_start + (cost / n) * (layer + 1) + ((cost % n) * (layer + 1)) / n;
}

/* Reports layers [layer_next, upto) of every member of the prefill step in progress. */
static void emit_layers(wk_sched_t *s, uint32_t upto)
{
    while (s->layer_next < upto) {
        uint32_t k = s->layer_next++;
        for (unsigned i = 0; i < s->step_n; i++)
            if (s->step[i] != NULL)
                s->on_layer(s, s->step[i], k);
    }
}

static int layered(const wk_sched_t *s)
{
    return s->step_kind == WK_STEP_PREFILL && s->on_layer != NULL;
}

/* The next time something happens: a layer end (never the last: the step end reports it) or
 * the step end. */
static uint64_t next_event(const wk_sched_t *s)
{
    if (layered(s) && s->layer_next + 1 < s->layers) {
        uint64_t t = wk_sched_layer_end(s, s->layer_next);
        if (t < s->step_end)
            return t;
    }
    return s->step_end;
}

void wk_sched_free(wk_sched_t *s)
{
    free(s->step);
    s->step = NULL;
}

void wk_sched_submit_prefill(wk_sched_t *s, wk_seq_t *seq)
{
    seq->where = WK_SEQ_PREFILL_Q;
    list_push(&s->prefill_q, seq);
}

void wk_sched_submit_decode(wk_sched_t *s, wk_seq_t *seq)
{
    seq->where = WK_SEQ_READY_Q;
    list_push(&s->ready_q, seq);
}

void wk_sched_cancel(wk_sched_t *s, wk_seq_t *seq)
{
    switch (seq->where) {
    case WK_SEQ_PREFILL_Q:
        list_remove(&s->prefill_q, seq);
        break;
    case WK_SEQ_READY_Q:
        list_remove(&s->ready_q, seq);
        break;
    case WK_SEQ_RUNNING:
        list_remove(&s->running, seq);
        break;
    case WK_SEQ_IN_STEP:
        /* The step keeps running without it: the slot is skipped at completion. */
        if (seq->slot < s->step_n && s->step[seq->slot] == seq)
            s->step[seq->slot] = NULL;
        break;
    case WK_SEQ_IDLE:
        break;
    }
    seq->where = WK_SEQ_IDLE;
}

static void put_in_step(wk_sched_t *s, wk_seq_t *seq)
{
    seq->where = WK_SEQ_IN_STEP;
    seq->slot = s->step_n;
    s->step[s->step_n++] = seq;
}

/* Starts the next step at virtual time t; 0 when there is nothing to do. */
static int start_step(wk_sched_t *s, uint64_t t)
{
    s->step_n = 0;
    unsigned max = s->cfg.max_batch;
    if (s->prefill_q.n > 0 && s->running.n < max) {
        uint64_t tokens = 0;
        unsigned limit = max - s->running.n;
        while (s->step_n < limit && s->prefill_q.n > 0) {
            wk_seq_t *seq = list_pop(&s->prefill_q);
            tokens +=
                seq->prompt_tokens -
                (seq->cached_tokens < seq->prompt_tokens ? seq->cached_tokens : seq->prompt_tokens);
            put_in_step(s, seq);
        }
        s->step_kind = WK_STEP_PREFILL;
        s->layer_next = 0;
        s->step_start = t;
        s->step_end = sat_add(t, sat_mul(tokens, s->cfg.prefill_ns_per_token));
        s->prefill_steps++;
        s->prefill_tokens += tokens;
        return 1;
    }
    while (s->running.n < max && s->ready_q.n > 0) {
        wk_seq_t *seq = list_pop(&s->ready_q);
        seq->where = WK_SEQ_RUNNING;
        list_push(&s->running, seq);
    }
    if (s->running.n == 0) {
        s->step_kind = WK_STEP_NONE;
        return 0;
    }
    while (s->running.n > 0)
        put_in_step(s, list_pop(&s->running));
    s->step_kind = WK_STEP_DECODE;
    s->step_start = t;
    s->step_end = sat_add(t, s->cfg.decode_ns_per_step);
    s->decode_steps++;
    return 1;
}

static void complete_step(wk_sched_t *s)
{
    wk_step_kind_t kind = s->step_kind;
    if (layered(s))
        emit_layers(s, s->layers); /* the last layer ends with the step */
    unsigned n = s->step_n;
    for (unsigned i = 0; i < n; i++) {
        wk_seq_t *seq = s->step[i];
        if (seq == NULL)
            continue; /* cancelled during the step */
        s->step[i] = NULL;
        seq->where = WK_SEQ_IDLE;
        int keep;
        if (kind == WK_STEP_PREFILL) {
            keep = s->on_prefilled(s, seq);
        } else {
            s->decode_tokens++;
            keep = s->on_decoded(s, seq);
        }
        if (keep) {
            seq->where = WK_SEQ_RUNNING;
            list_push(&s->running, seq);
        }
    }
    s->step_n = 0;
    s->step_kind = WK_STEP_NONE;
}

uint64_t wk_sched_poll(wk_sched_t *s, uint64_t now, unsigned max_steps)
{
    unsigned done = 0;
    if (s->step_kind == WK_STEP_NONE && !start_step(s, now))
        return WK_SCHED_IDLE;
    for (;;) {
        if (layered(s)) {
            uint32_t upto = s->layer_next;
            while (upto + 1 < s->layers && wk_sched_layer_end(s, upto) <= now &&
                   wk_sched_layer_end(s, upto) < s->step_end)
                upto++;
            emit_layers(s, upto);
        }
        if (s->step_end > now || done >= max_steps)
            return next_event(s);
        uint64_t t = s->step_end;
        complete_step(s);
        done++;
        if (!start_step(s, t))
            return WK_SCHED_IDLE;
    }
}

unsigned wk_sched_waiting(const wk_sched_t *s)
{
    return s->prefill_q.n + s->ready_q.n;
}

unsigned wk_sched_running(const wk_sched_t *s)
{
    return s->running.n + s->step_n; /* a prefill step's members count as running too */
}

int wk_sched_busy(const wk_sched_t *s)
{
    return s->step_kind != WK_STEP_NONE;
}
