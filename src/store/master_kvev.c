/* store/master_kvev.c — the leader master's KV events: objects put with the KV block they hold
 * are published as vLLM BlockStored events when they commit and BlockRemoved when they are freed
 * (ZMQ PUB + replay through src/kvevents), so a router's index can count L3-reachable blocks. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "common/log.h"
#include "kvevents/zsock.h"
#include "store/master.h"

#define COMP        "store"
#define TOKENS_MAX  4096
#define PENDING_MAX 65536 /* events between flushes; past it a clear replaces them */

/* An object that holds a block: its hash and parent, its token ids until BlockStored is out. */
typedef struct blk_s {
    struct blk_s *next;
    uint64_t put_id;
    int64_t hash, parent, lora;
    uint8_t has_parent, has_lora, stored;
    uint32_t n_tokens;
    uint32_t *tokens;
} blk_t;

/* An event waiting for the next batch (it owns its copies). */
typedef struct {
    baton_kvev_type_t type;
    baton_kvev_hash_t hash, parent;
    int has_parent, has_lora;
    int64_t lora;
    uint32_t n_tokens;
    uint32_t *tokens;
} pev_t;

struct baton__mkvev_s {
    baton__master_t *ms;
    baton_kvev_pub_t *pub;
    char medium[BATON_KVEV_MEDIUM_MAX + 1];
    blk_t **buckets;
    size_t n_buckets, n_blocks;
    pev_t *pending;
    size_t n_pending, cap_pending;
    int overflow;
    uv_poll_t poll;
    uv_timer_t service, kick;
    int has_poll;
    baton__mkvev_stats_t st;
};

/* ---- the table of blocks by put id ---------------------------------------------------------- */

static blk_t **slot(baton__mkvev_t *k, uint64_t put_id)
{
    blk_t **pp = &k->buckets[(put_id * 0x9e3779b97f4a7c15ull >> 32) & (k->n_buckets - 1)];
    while (*pp && (*pp)->put_id != put_id)
        pp = &(*pp)->next;
    return pp;
}

static void grow(baton__mkvev_t *k)
{
    size_t n = k->n_buckets * 2;
    blk_t **b = calloc(n, sizeof(*b));
    if (b == NULL)
        return; /* longer chains, still correct */
    blk_t **old = k->buckets;
    size_t n_old = k->n_buckets;
    k->buckets = b;
    k->n_buckets = n;
    for (size_t i = 0; i < n_old; i++)
        for (blk_t *x = old[i], *next; x; x = next) {
            next = x->next;
            blk_t **pp = slot(k, x->put_id);
            x->next = *pp;
            *pp = x;
        }
    free(old);
}

static blk_t *add_block(baton__mkvev_t *k, uint64_t put_id)
{
    if (k->n_blocks >= k->n_buckets)
        grow(k);
    blk_t **pp = slot(k, put_id);
    if (*pp)
        return *pp;
    blk_t *b = calloc(1, sizeof(*b));
    if (b == NULL)
        return NULL;
    b->put_id = put_id;
    *pp = b;
    k->n_blocks++;
    return b;
}

static void drop_block(baton__mkvev_t *k, blk_t **pp)
{
    blk_t *b = *pp;
    *pp = b->next;
    free(b->tokens);
    free(b);
    k->n_blocks--;
}

/* ---- events --------------------------------------------------------------------------------- */

static void flush(baton__mkvev_t *k);

static void on_kick(uv_timer_t *t)
{
    flush(t->data);
}

static pev_t *queue_event(baton__mkvev_t *k, baton_kvev_type_t type)
{
    if (k->n_pending == PENDING_MAX) {
        k->overflow = 1; /* subscribers clear rather than trust a hole */
        return NULL;
    }
    if (k->n_pending == k->cap_pending) {
        size_t cap = k->cap_pending ? k->cap_pending * 2 : 64;
        pev_t *p = realloc(k->pending, cap * sizeof(*p));
        if (p == NULL) {
            k->overflow = 1;
            return NULL;
        }
        k->pending = p;
        k->cap_pending = cap;
    }
    pev_t *e = &k->pending[k->n_pending++];
    memset(e, 0, sizeof(*e));
    e->type = type;
    if (!uv_is_active((uv_handle_t *)&k->kick))
        uv_timer_start(&k->kick, on_kick, 0, 0);
    return e;
}

static void queue_stored(baton__mkvev_t *k, blk_t *b)
{
    pev_t *e = queue_event(k, BATON_KVEV_STORED);
    if (e) {
        e->hash.i = b->hash;
        e->has_parent = b->has_parent;
        e->parent.i = b->parent;
        e->has_lora = b->has_lora;
        e->lora = b->lora;
        e->n_tokens = b->n_tokens;
        e->tokens = b->tokens; /* handed over: the block needs them no more */
        b->tokens = NULL;
    }
    b->stored = 1;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* One batch with every pending event (or, after an overflow, one AllBlocksCleared). */
static void flush(baton__mkvev_t *k)
{
    if (k->n_pending == 0 && !k->overflow)
        return;
    baton_kvev_event_t *ev = calloc(k->n_pending ? k->n_pending : 1, sizeof(*ev));
    baton_kvev_batch_t b = {.ts = now_s(), .dp_rank = -1, .events = ev, .n_events = 0};
    if (ev && !k->overflow) {
        for (size_t i = 0; i < k->n_pending; i++) {
            pev_t *p = &k->pending[i];
            baton_kvev_event_t *e = &ev[i];
            e->type = p->type;
            if (p->type != BATON_KVEV_CLEARED) {
                e->hashes = &p->hash;
                e->n_hashes = 1;
                snprintf(e->medium, sizeof(e->medium), "%s", k->medium);
            }
            if (p->type == BATON_KVEV_STORED) {
                e->has_parent = p->has_parent;
                e->parent = p->parent;
                e->token_ids = p->tokens;
                e->n_tokens = p->n_tokens;
                e->block_size = p->n_tokens;
                e->has_lora = p->has_lora;
                e->lora_id = p->lora;
                k->st.stored++;
            } else if (p->type == BATON_KVEV_REMOVED) {
                k->st.removed++;
            }
        }
        b.n_events = (uint32_t)k->n_pending;
    } else if (ev) {
        ev[0].type = BATON_KVEV_CLEARED;
        b.n_events = 1;
        k->st.overflows++;
    }
    if (ev == NULL || baton_kvev_pub_send(k->pub, &b) < 0) {
        k->st.send_failures++;
        log_warn(COMP, "kv_events_publish_failed events=%u", b.n_events);
    } else {
        k->st.batches++;
    }
    free(ev);
    for (size_t i = 0; i < k->n_pending; i++)
        free(k->pending[i].tokens);
    k->n_pending = 0;
    k->overflow = 0;
}

/* ---- what the master tells ------------------------------------------------------------------ */

int baton__mkvev_parse(const baton__sp_msg_t *req, baton__mkvev_req_t *out)
{
    memset(out, 0, sizeof(*out));
    if (req->text_len == 0)
        return 0;
    json_error_t je;
    out->blocks = json_loadb(req->text, req->text_len, 0, &je);
    if (!json_is_array(out->blocks) || json_array_size(out->blocks) > req->n_items)
        goto bad;
    size_t i;
    json_t *b;
    json_array_foreach(out->blocks, i, b)
    {
        json_t *idx = json_array_get(b, 0), *h = json_array_get(b, 1), *p = json_array_get(b, 2);
        json_t *ids = json_array_get(b, 3), *lora = json_array_get(b, 4);
        if (json_array_size(b) != 5 || !json_is_integer(idx) || json_integer_value(idx) < 0 ||
            json_integer_value(idx) >= (json_int_t)req->n_items || !json_is_integer(h) ||
            !(json_is_null(p) || json_is_integer(p)) || !json_is_array(ids) ||
            json_array_size(ids) == 0 || json_array_size(ids) > TOKENS_MAX ||
            !(json_is_null(lora) || json_is_integer(lora)))
            goto bad;
        size_t j;
        json_t *id;
        json_array_foreach(ids, j, id)
        {
            if (!json_is_integer(id) || json_integer_value(id) < 0 ||
                json_integer_value(id) > (json_int_t)UINT32_MAX)
                goto bad;
        }
    }
    return 0;
bad:
    json_decref(out->blocks);
    out->blocks = NULL;
    return BATON_XFER_EINVAL;
}

void baton__mkvev_put_started(baton__master_t *ms, baton__mkvev_req_t *req,
                              const baton__sp_ritem_t *ritems)
{
    baton__mkvev_t *k = ms->kvev;
    size_t i;
    json_t *b;
    if (k && req->blocks)
        json_array_foreach(req->blocks, i, b)
        {
            const baton__sp_ritem_t *it = &ritems[json_integer_value(json_array_get(b, 0))];
            if (it->status != 0)
                continue;
            json_t *ids = json_array_get(b, 3);
            blk_t *x = add_block(k, it->put_id);
            uint32_t *tokens = calloc(json_array_size(ids), sizeof(*tokens));
            if (x == NULL || tokens == NULL) {
                free(tokens);
                continue;
            }
            x->hash = json_integer_value(json_array_get(b, 1));
            x->has_parent = json_is_integer(json_array_get(b, 2));
            x->parent = json_integer_value(json_array_get(b, 2));
            x->has_lora = json_is_integer(json_array_get(b, 4));
            x->lora = json_integer_value(json_array_get(b, 4));
            free(x->tokens);
            x->tokens = tokens;
            x->n_tokens = (uint32_t)json_array_size(ids);
            for (size_t j = 0; j < x->n_tokens; j++)
                tokens[j] = (uint32_t)json_integer_value(json_array_get(ids, j));
        }
    json_decref(req->blocks);
    req->blocks = NULL;
}

void baton__mkvev_journal(baton__master_t *ms, const baton__meta_rec_t *rec)
{
    baton__mkvev_t *k = ms->kvev;
    if (k == NULL || k->n_blocks == 0)
        return;
    blk_t **pp = slot(k, rec->put_id);
    if (*pp == NULL)
        return;
    if (rec->state == BATON__OBJ_COMPLETE) {
        queue_stored(k, *pp);
    } else if (rec->state == BATON__OBJ_FREED) {
        if ((*pp)->stored) {
            pev_t *e = queue_event(k, BATON_KVEV_REMOVED);
            if (e)
                e->hash.i = (*pp)->hash;
        }
        drop_block(k, pp);
    }
}

json_t *baton__mkvev_block_json(baton__master_t *ms, uint64_t put_id)
{
    baton__mkvev_t *k = ms->kvev;
    blk_t *b = k ? *slot(k, put_id) : NULL;
    if (b == NULL || b->tokens == NULL)
        return NULL;
    json_t *ids = json_array();
    for (uint32_t i = 0; i < b->n_tokens; i++)
        json_array_append_new(ids, json_integer(b->tokens[i]));
    return json_pack("[I,o,o,o]", (json_int_t)b->hash,
                     b->has_parent ? json_integer(b->parent) : json_null(), ids,
                     b->has_lora ? json_integer(b->lora) : json_null());
}

void baton__mkvev_restored(baton__master_t *ms, uint64_t put_id, json_t *block)
{
    baton__mkvev_t *k = ms->kvev;
    json_t *h = json_array_get(block, 0), *p = json_array_get(block, 1);
    json_t *ids = json_array_get(block, 2), *lora = json_array_get(block, 3);
    if (k == NULL || !json_is_integer(h) || !json_is_array(ids) || json_array_size(ids) == 0 ||
        json_array_size(ids) > TOKENS_MAX)
        return;
    blk_t *x = add_block(k, put_id);
    uint32_t *tokens = calloc(json_array_size(ids), sizeof(*tokens));
    if (x == NULL || tokens == NULL) {
        free(tokens);
        return;
    }
    x->hash = json_integer_value(h);
    x->has_parent = json_is_integer(p);
    x->parent = json_integer_value(p);
    x->has_lora = json_is_integer(lora);
    x->lora = json_integer_value(lora);
    free(x->tokens);
    x->tokens = tokens;
    x->n_tokens = (uint32_t)json_array_size(ids);
    for (size_t j = 0; j < x->n_tokens; j++)
        tokens[j] = (uint32_t)json_integer_value(json_array_get(ids, j));
    queue_stored(k, x);
}

void baton__mkvev_leading(baton__master_t *ms)
{
    if (ms->kvev) /* what an earlier leader published is history: subscribers start over */
        queue_event(ms->kvev, BATON_KVEV_CLEARED);
}

/* ---- life ----------------------------------------------------------------------------------- */

static void on_poll(uv_poll_t *h, int status, int events)
{
    baton__mkvev_t *k = h->data;
    (void)status;
    (void)events;
    baton_kvev_pub_service(k->pub);
}

static void on_service(uv_timer_t *t)
{
    baton__mkvev_t *k = t->data; /* ZMQ's descriptor is edge-triggered: a sweep catches a miss */
    baton_kvev_pub_service(k->pub);
}

int baton__mkvev_start(baton__master_t *ms)
{
    const baton__master_opts_t *o = &ms->opts;
    if (o->kv_events_endpoint == NULL)
        return 0;
    baton__mkvev_t *k = calloc(1, sizeof(*k));
    if (k == NULL)
        return BATON_XFER_ENOMEM;
    k->ms = ms;
    k->n_buckets = 1024;
    k->buckets = calloc(k->n_buckets, sizeof(*k->buckets));
    snprintf(k->medium, sizeof(k->medium), "%s", o->kv_events_medium);
    baton_kvev_pub_opts_t po = {.endpoint = o->kv_events_endpoint,
                                .replay_endpoint = o->kv_events_replay_endpoint,
                                .encoding = BATON_KVEV_ENC_MAP,
                                .reply_with_topic = 1};
    char err[256] = "out of memory";
    if (k->buckets == NULL || (k->pub = baton_kvev_pub_open(&po, err, sizeof(err))) == NULL) {
        log_error(COMP, "kv_events_start_failed reason=\"%s\"", err);
        free(k->buckets);
        free(k);
        return BATON_XFER_EINVAL;
    }
    int fd = baton_kvev_pub_replay_fd(k->pub);
    if (fd >= 0 && uv_poll_init(ms->loop, &k->poll, fd) == 0) {
        k->poll.data = k;
        k->has_poll = 1;
        uv_poll_start(&k->poll, UV_READABLE, on_poll);
    }
    uv_timer_init(ms->loop, &k->service);
    uv_timer_init(ms->loop, &k->kick);
    k->service.data = k->kick.data = k;
    uv_timer_start(&k->service, on_service, 100, 100);
    for (int r = 0; r < 2; r++) {
        const char *ep = baton_kvev_pub_endpoint(k->pub, r);
        if (strncmp(ep, "tcp://", 6) == 0)
            log_info(COMP, "%s_listening addr=%s", r ? "kvreplay" : "kvevents", ep + 6);
        else if (ep[0])
            log_info(COMP, "%s_listening endpoint=%s", r ? "kvreplay" : "kvevents", ep);
    }
    ms->kvev = k;
    return 0;
}

void baton__mkvev_stats(const baton__master_t *ms, baton__mkvev_stats_t *st)
{
    if (ms->kvev) {
        *st = ms->kvev->st;
        st->blocks = ms->kvev->n_blocks;
    } else {
        memset(st, 0, sizeof(*st));
    }
}
