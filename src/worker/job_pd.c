/* job_pd.c — the KV hand-off steps of a prefill or decode job (see job.h): rooms, page
 * reservations, the prefill's compute and hand-off, the decode's verified KV and first token. */
#include <stdio.h>
#include <stdlib.h>

#include "baton/error.h"
#include "worker/job.h"
#include "worker/vllm.h"

/* Fills *pr for item i; *tmp_p is an allocation to free after use (NULL when none). */
int wk__job_item_prompt(const wk_item_t *it, wk_kv_prompt_t *pr, int64_t **tmp_p)
{
    pr->n_tokens = it->prompt_tokens;
    pr->seed = it->seed;
    pr->want_first = it->max_tokens > 0;
    pr->cached_tokens = it->cached_tokens; /* 0 on the prefill side: it offers nothing */
    pr->pull = 0;
    return wk__item_ids(it, &pr->ids, tmp_p);
}

/* Page slots every sequence of the job needs, in item order. */
static uint32_t job_slots_needed(wk_job_t *job)
{
    uint64_t n = 0;
    for (size_t i = 0; i < job->req.n_items; i++)
        n += wk_kv_slots_for(job->w->kv, job->req.items[i].prompt_tokens);
    return n > UINT32_MAX ? UINT32_MAX : (uint32_t)n;
}

/* Moves the job to PAGES and reserves its slots; then() runs once they are there (now or
 * later). On an error the job has failed. */
static void job_reserve(wk_job_t *job, void (*then)(wk_job_t *job), wk_kv_resv_cb cb)
{
    wk_worker_t *w = job->w;
    wk_job_to(job, WK_JOB_PAGES);
    job->n_slots = job_slots_needed(job);
    job->slots = malloc((size_t)job->n_slots * sizeof(*job->slots));
    if (job->slots == NULL) {
        wk__job_fail_err(job, BATON_ENOMEM, "kv pages", NULL);
        return;
    }
    int rc = wk_kv_reserve(w->kv, &job->resv, job->n_slots, job->slots, cb, job);
    if (rc == BATON_ETOOBIG || rc < 0) {
        char msg[200];
        snprintf(msg, sizeof(msg),
                 "the prompt needs %u KV page slots, more than the whole pool (%u); raise "
                 "--kv-pool-tokens",
                 job->n_slots, wk_kv_pool_slots(w->kv));
        wk__job_fail_reason(job, 503, msg, "kv_pool_exhausted", "pool_exhausted");
        return;
    }
    if (rc == 0)
        then(job); /* else queued: the pool calls cb */
}

/* ---- prefill: match rooms, reserve source pages, compute, hand off ------------------------ */

void wk_job_on_layer(wk_sched_t *s, wk_seq_t *seq, uint32_t layer)
{
    wk_sstate_t *ss = seq->data;
    (void)s;
    /* The KV of the layer exists now either way (filling it is the simulation's stand-in for
     * computing it, so it overlaps the compute in both modes); only layer-wise sends it now. */
    if (ss->send)
        wk_kv_send_layer(ss->send, layer, ss->job->w->cfg.layerwise);
}

void wk__job_pd_prefilled(wk_sstate_t *ss)
{
    wk_job_t *job = ss->job;
    const wk_item_t *it = &job->req.items[ss->index];
    int32_t first = it->max_tokens > 0 ? wk_sim_token(it->seed, 0) : -1;
    if (ss->gen.finish == WK_FINISH_NONE && wk_gen_push(&ss->gen, first) != 0) {
        wk__job_fail_err(job, BATON_ENOMEM, "prefill", NULL);
        return;
    }
    /* the rest of the KV goes out now; the answer waits for DONE */
    wk_seq_to(ss, WK_SS_HANDOFF);
    wk_kv_send_finish(ss->send, first);
}

static void on_sent(void *data, int status, const char *detail)
{
    wk_sstate_t *ss = data;
    wk_job_t *job = ss->job;
    ss->send = NULL;
    if (status != 0) {
        wk__job_fail_err(job, status, "prefill handoff", detail);
        return;
    }
    if (wk__job_seq_finish(ss))
        wk__job_complete(job);
}

/* Every room met its offer and the source pages are reserved: compute. */
static void prefill_go(wk_job_t *job)
{
    wk_worker_t *w = job->w;
    wk_job_to(job, WK_JOB_RUNNING);
    uint32_t off = 0;
    for (size_t i = 0; i < job->req.n_items; i++) {
        wk_sstate_t *ss = &job->ss[i];
        uint32_t n = wk_kv_slots_for(w->kv, job->req.items[i].prompt_tokens);
        if (wk_kv_send_slots(ss->send, job->slots + off) != 0) {
            wk_kv_unreserve(w->kv, job->slots + off, job->n_slots - off);
            wk__job_fail_err(job, BATON_ENOMEM, "prefill", NULL);
            return;
        }
        off += n;
    }
    wk__job_submit_prefill(job);
}

static void on_prefill_slots(wk_kv_resv_t *r)
{
    prefill_go(r->w.data);
}

static void on_matched(void *data)
{
    wk_sstate_t *ss = data;
    wk_job_t *job = ss->job;
    if (ss->phase != WK_SS_KV_WAIT)
        return;
    wk_seq_to(ss, WK_SS_MATCHED);
    if (++job->n_matched == job->req.n_items)
        job_reserve(job, prefill_go, on_prefill_slots);
}

/* ---- decode: reserve pages, offer the rooms, verify, decode ------------------------------- */

/* Every room of the job has its KV; start answering. */
static void decode_begin(wk_job_t *job)
{
    wk_worker_t *w = job->w;
    int all_done = 0, submitted = 0;
    wk_job_to(job, WK_JOB_RUNNING);
    for (size_t i = 0; i < job->req.n_items; i++) {
        wk_sstate_t *ss = &job->ss[i];
        /* the KV's first token is token 0; a continuation replayed past it goes on from there */
        int32_t next = ss->gen.n_tokens > 0 ? wk_gen_next_id(&ss->gen) : ss->first_token;
        if (ss->gen.finish == WK_FINISH_NONE && wk__job_seq_push(ss, next, "decode"))
            return;
        if (ss->gen.finish != WK_FINISH_NONE) {
            all_done = wk__job_seq_finish(ss);
        } else {
            wk_seq_to(ss, WK_SS_RUNNING);
            ss->seq.prompt_tokens = job->req.items[i].prompt_tokens;
            wk_sched_submit_decode(&w->sched, &ss->seq);
            submitted = 1;
        }
    }
    if (submitted)
        wk_worker_sched_kick(w);
    if (all_done)
        wk__job_complete(job);
}

static void on_received(void *data, int status, const wk_kv_got_t *got, const char *detail)
{
    wk_sstate_t *ss = data;
    wk_job_t *job = ss->job;
    if (status != 0) {
        ss->recv = NULL; /* gone with the failure */
        wk__job_fail_err(job, status, "decode", detail);
        return;
    }
    wk_seq_to(ss, WK_SS_KV_IN);
    /* the generator continues from what the KV says: its seed and the first token */
    ss->gen.seed = got->seed;
    ss->first_token = got->first_token;
    if (++job->n_booted == job->req.n_items) {
        wk_vllm_hb_stop(job->hb); /* every pull is done: the prefill's lease is over */
        job->hb = NULL;
        decode_begin(job);
    }
}

static void decode_offer(wk_job_t *job)
{
    wk_worker_t *w = job->w;
    wk_job_to(job, WK_JOB_RECEIVING);
    uint32_t off = 0;
    for (size_t i = 0; i < job->req.n_items; i++) {
        wk_sstate_t *ss = &job->ss[i];
        const wk_item_t *it = &job->req.items[i];
        uint32_t n = wk_kv_slots_for(w->kv, it->prompt_tokens);
        wk_kv_prompt_t pr;
        int64_t *tmp = NULL;
        int rc = wk__job_item_prompt(it, &pr, &tmp);
        pr.pull = job->req.vllm_leg == WK_VLLM_NIXL_DECODE; /* the prefill exported its KV */
        if (rc == 0)
            rc = wk_kv_recv_start(w->kv, it->boot_host, it->boot_port, it->room, &pr,
                                  job->slots + off, on_received, ss, &ss->recv);
        free(tmp);
        if (rc != 0) {
            /* the slots of the rooms that started are theirs now; the rest come back */
            wk_kv_unreserve(w->kv, job->slots + off, job->n_slots - off);
            wk__job_fail_err(job, rc, "decode", NULL);
            return;
        }
        off += n;
    }
}

static void on_decode_slots(wk_kv_resv_t *r)
{
    decode_offer(r->w.data);
}

/* ---- start -------------------------------------------------------------------------------- */

void wk__job_pd_start(wk_job_t *job)
{
    wk_worker_t *w = job->w;
    for (size_t i = 0; i < job->req.n_items; i++)
        wk_seq_to(&job->ss[i], WK_SS_KV_WAIT);
    if (w->cfg.mode == WK_MODE_DECODE) {
        const wk_request_t *rq = &job->req;
        /* vLLM: heartbeats start when the request arrives, not when it is scheduled */
        if (rq->vllm_leg == WK_VLLM_NIXL_DECODE && rq->lease_port > 0 && rq->n_items > 0 &&
            wk_vllm_hb_start(&job->hb, w->loop, rq->items[0].boot_host, rq->lease_port,
                             rq->vllm_rid, w->cfg.kv_hold_timeout_ms) != 0)
            job->hb = NULL;       /* no heartbeats: the prefill's lease alone decides */
        wk__job_cache_match(job); /* what a follow-up turn finds of its earlier turns */
        job_reserve(job, decode_offer, on_decode_slots);
        return;
    }
    wk_job_to(job, WK_JOB_MATCHING);
    for (size_t i = 0; i < job->req.n_items; i++) {
        wk_sstate_t *ss = &job->ss[i];
        const wk_item_t *it = &job->req.items[i];
        wk_kv_prompt_t pr;
        int64_t *tmp = NULL;
        int rc = wk__job_item_prompt(it, &pr, &tmp);
        if (rc == 0)
            rc = wk_kv_send_open(w->kv, it->room, &pr, on_matched, on_sent, ss, &ss->send);
        free(tmp);
        if (rc != 0) {
            wk__job_fail_err(job, rc, "prefill", NULL);
            return;
        }
    }
}
