/* kvxfer.c — baton-worker's KV hand-off through libbaton (see kvxfer.h): the engine, the page
 * region and pool, thread-pool jobs, deferred callbacks; the prefill side's rooms are in
 * kvxfer_send.c, the decode side's in kvxfer_recv.c, the metrics in kvxfer_metrics.c. */
#include "worker/kvxfer.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "baton/error.h"
#include "common/clock.h"
#include "common/log.h"
#include "worker/kvdone.h"
#include "worker/kvpattern.h"
#include "worker/kvxfer_int.h"

#define COMP WK_KV_COMP

/* ---- deferred work: matched callbacks and pool waiters ------------------------------------ */

static void defer_cb(uv_idle_t *h);

void wk__kv_kick(wk_kv_t *kv)
{
    if (kv->handles_ok)
        uv_idle_start(&kv->defer, defer_cb);
}

static void defer_cb(uv_idle_t *h)
{
    wk_kv_t *kv = h->data;
    wk__kv_send_deliver_matched(kv);
    wk_kvwait_t *w;
    while ((w = wk_kvpool_next_ready(&kv->pool)) != NULL) {
        wk_kv_resv_t *r = (wk_kv_resv_t *)w;
        r->cb(r);
    }
    if (baton_list_empty(&kv->matched))
        uv_idle_stop(h);
}

static void tick_cb(uv_timer_t *t)
{
    wk_kv_t *kv = t->data;
    wk__kv_send_expire(kv, baton_now_ms());
}

/* ---- pool ------------------------------------------------------------------------------- */

uint32_t wk_kv_slots_for(const wk_kv_t *kv, uint32_t n_tokens)
{
    return wk_kvshape_pages(&kv->cfg.shape, n_tokens ? n_tokens : 1);
}

uint32_t wk_kv_pool_slots(const wk_kv_t *kv)
{
    return kv->n_slots;
}

int wk_kv_reserve(wk_kv_t *kv, wk_kv_resv_t *r, uint32_t n, uint32_t *slots, wk_kv_resv_cb cb,
                  void *data)
{
    memset(r, 0, sizeof(*r));
    r->kv = kv;
    r->cb = cb;
    r->w.n = n;
    r->w.slots = slots;
    r->w.data = data;
    int rc = wk_kvpool_take(&kv->pool, n, slots);
    if (rc == 0)
        return 0;
    if (rc != BATON_EBUSY)
        return rc;
    wk_kvpool_wait(&kv->pool, &r->w);
    return 1;
}

void wk_kv_reserve_cancel(wk_kv_t *kv, wk_kv_resv_t *r)
{
    int was_head = wk_kvpool_head(&kv->pool) == &r->w;
    wk_kvpool_cancel(&kv->pool, &r->w);
    if (was_head)
        wk__kv_kick(kv); /* the next one may fit now */
}

void wk_kv_unreserve(wk_kv_t *kv, const uint32_t *slots, uint32_t n)
{
    wk_kvpool_put(&kv->pool, slots, n);
    wk__kv_kick(kv);
}

uint8_t *wk__kv_page_addr(const wk_kv_t *kv, uint32_t layer, uint32_t slot)
{
    return kv->base + ((uint64_t)layer * kv->n_slots + slot) * kv->page_bytes;
}

uint64_t wk__kv_page_len(const wk_kv_t *kv, uint32_t n_tokens, uint32_t page)
{
    return (uint64_t)wk_kvshape_page_tokens_at(&kv->cfg.shape, n_tokens, page) * kv->token_bytes;
}

void wk__kv_room_iov(const wk_kv_t *kv, const uint32_t *slots, uint32_t ppl, uint32_t n_tokens,
                     uint32_t l0, uint32_t l1, baton_xfer_iov_t *iov)
{
    for (uint32_t l = l0; l < l1; l++)
        for (uint32_t j = 0; j < ppl; j++, iov++) {
            iov->addr = wk__kv_page_addr(kv, l, slots[j]);
            iov->len = wk__kv_page_len(kv, n_tokens, j);
        }
}

void wk__kv_fill_layer(const wk_kv_t *kv, const uint32_t *slots, const wk_kv_roomp_t *p,
                       uint32_t layer)
{
    uint32_t P = kv->cfg.shape.page_tokens;
    for (uint32_t j = 0; j < p->ppl; j++) {
        if (j >= p->loaded_first && j < p->loaded_first + p->loaded_n)
            continue; /* loaded from L2: those bytes travel as they were fetched */
        uint32_t first = j * P;
        uint32_t n = wk_kvshape_page_tokens_at(&kv->cfg.shape, p->n_tokens, j);
        wk_kv_fill(wk__kv_page_addr(kv, layer, slots[j]), kv->token_bytes, p->ids + first, first, n,
                   layer);
    }
}

void wk__kv_done_encode(const wk_kv_t *kv, const wk_kv_roomp_t *p, uint8_t out[WK_KVDONE_LEN])
{
    wk_kvdone_t d = {
        p->n_tokens, kv->cfg.shape.layers, kv->token_bytes, kv->cfg.shape.page_tokens, p->seed, 1,
        p->hits[0],  p->hits[1],           p->hits[2]};
    wk_kvdone_encode(&d, out);
}

void wk__kv_lease_drop(wk_kv_t *kv, wk_kvlease_t *l, unsigned hold)
{
    if (wk_kvlease_drop(&kv->pool, l, hold))
        wk__kv_kick(kv);
}

void wk__kv_lease_work_done(wk_kv_t *kv, wk_kvlease_t *l)
{
    if (wk_kvlease_work_done(&kv->pool, l))
        wk__kv_kick(kv);
}

int64_t *wk__kv_copy_ids(const wk_kv_prompt_t *pr)
{
    int64_t *ids = malloc((size_t)pr->n_tokens * sizeof(*ids));
    if (ids)
        memcpy(ids, pr->ids, (size_t)pr->n_tokens * sizeof(*ids));
    return ids;
}

/* ---- thread-pool work -------------------------------------------------------------------- */

int wk__kv_queue_work(wk_kv_t *kv, wk_kvlease_t *lease, void *room, uint32_t l0, uint32_t l1,
                      uv_work_cb work, uv_after_work_cb after)
{
    return wk__kv_queue_work_init(kv, lease, room, l0, l1, NULL, work, after);
}

int wk__kv_queue_work_init(wk_kv_t *kv, wk_kvlease_t *lease, void *room, uint32_t l0, uint32_t l1,
                           const wk_kv_work_t *init, uv_work_cb work, uv_after_work_cb after)
{
    wk_kv_work_t *w = calloc(1, sizeof(*w));
    if (w == NULL)
        return BATON_ENOMEM;
    if (init)
        *w = *init;
    w->kv = kv;
    w->room = room;
    w->l0 = l0;
    w->l1 = l1;
    w->req.data = w;
    int rc = uv_queue_work(kv->loop, &w->req, work, after);
    if (rc != 0) {
        free(w);
        return rc;
    }
    kv->work_inflight++;
    wk_kvlease_work_start(lease);
    return 0;
}

void wk__kv_work_end(wk_kv_work_t *w, wk_kvlease_t *lease)
{
    wk_kv_t *kv = w->kv;
    kv->work_inflight--;
    free(w);
    wk__kv_lease_work_done(kv, lease);
}

/* ---- decode: pre-faulting the page region ----------------------------------------------- */

/*
 * The decode's region is a fresh memfd: every page's first write (by the transport, whichever
 * process makes it) takes a page fault and a zeroed page, measured at about 1.5 GB/s against
 * about 20 GB/s into touched memory. So the decode touches the whole region once at start, on
 * the thread pool in chunks (the loop never waits; a room that arrives meanwhile is only
 * slower). MADV_POPULATE_WRITE (Linux 5.14) faults pages in writable without changing a byte;
 * where it is missing, an atomic add of 0 per page does the same. Neither writes data, so a
 * transfer into pages being touched at the same moment is safe.
 */
#define PREFAULT_CHUNK (64ull << 20)
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

typedef struct {
    uv_work_t req;
    wk_kv_t *kv;
    uint8_t *addr;
    size_t len;
} prefault_t;

static void prefault_work(uv_work_t *req)
{
    prefault_t *p = req->data;
    if (madvise(p->addr, p->len, MADV_POPULATE_WRITE) == 0)
        return;
    for (size_t off = 0; off < p->len; off += 4096)
        __atomic_fetch_add(p->addr + off, 0, __ATOMIC_RELAXED);
}

static void prefault_done(uv_work_t *req, int status)
{
    prefault_t *p = req->data;
    wk_kv_t *kv = p->kv;
    (void)status;
    kv->work_inflight--;
    if (--kv->prefault_left == 0)
        log_info(COMP, "kv_prefault_done bytes=%" PRIu64 " ms=%.1f", kv->prefault_bytes,
                 (double)(uv_hrtime() - kv->prefault_t0) / 1e6);
    free(p);
    wk__kv_maybe_destroy_engine(kv);
}

/* Queues the touch of [base, base+len); a chunk that cannot be queued is simply left cold. */
static void prefault_start(wk_kv_t *kv, uint8_t *base, uint64_t len)
{
    kv->prefault_t0 = uv_hrtime();
    kv->prefault_bytes = len;
    for (uint64_t off = 0; off < len; off += PREFAULT_CHUNK) {
        prefault_t *p = calloc(1, sizeof(*p));
        if (p == NULL)
            return;
        p->kv = kv;
        p->addr = base + off;
        p->len = (size_t)(len - off < PREFAULT_CHUNK ? len - off : PREFAULT_CHUNK);
        p->req.data = p;
        if (uv_queue_work(kv->loop, &p->req, prefault_work, prefault_done) != 0) {
            free(p);
            return;
        }
        kv->work_inflight++;
        kv->prefault_left++;
    }
}

static void on_peer(baton_xfer_engine_t *eng, const baton_xfer_peer_info_t *info, void *data)
{
    wk_kv_t *kv = data;
    static const char *names[] = {"?", "connecting", "up", "down", "gone"};
    log_debug(COMP, "kv_peer endpoint=%s id=%s state=%s transport=%s reason=%s", info->endpoint,
              info->engine_id[0] ? info->engine_id : "-", names[info->state <= 4 ? info->state : 0],
              baton_xfer_transport_name(info->transport),
              info->reason ? baton_err_name(info->reason) : "-");
    if (!kv->cfg.prefill)
        wk__kv_recv_peer_event(kv, info);
}

/* ---- create / close ------------------------------------------------------------ */

void wk_kv_transport_list(const baton_xfer_transport_t *t, int n, char *out, size_t cap)
{
    size_t len = 0;
    out[0] = '\0';
    for (int i = 0; i < n && len < cap; i++)
        len += (size_t)snprintf(out + len, cap - len, "%s%s", i ? "," : "",
                                baton_xfer_transport_name(t[i]));
}

/* The KV bootstrap secret: the file's bytes, less one trailing newline (`echo s > file`).
 * 0, or -1 with a log line (unreadable, too short or too long). */
static int read_secret(const char *path, uint8_t *buf, size_t cap, size_t *len_p)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        log_error(COMP, "kv_secret_unreadable reason=\"cannot read %s: %s\"", path,
                  strerror(errno));
        return -1;
    }
    struct stat st;
    /* Readable by other users: a warning. Group-readable is how Kubernetes mounts a Secret for
     * a non-root pod (mode 0440, group fsGroup). */
    if (fstat(fileno(f), &st) == 0 && (st.st_mode & 007) != 0)
        log_warn(COMP, "kv_secret_file_permissions path=%s mode=%03o hint=\"chmod 640\"", path,
                 (unsigned)(st.st_mode & 0777));
    size_t n = fread(buf, 1, cap, f);
    int more = fgetc(f) != EOF;
    fclose(f);
    if (n > 0 && buf[n - 1] == '\n')
        n--;
    if (n > 0 && buf[n - 1] == '\r')
        n--;
    if (more || n < BATON_XFER_SECRET_MIN || n > BATON_XFER_SECRET_MAX) {
        log_error(COMP, "kv_secret_invalid path=%s reason=\"between %d and %d bytes expected\"",
                  path, BATON_XFER_SECRET_MIN, BATON_XFER_SECRET_MAX);
        return -1;
    }
    *len_p = n;
    return 0;
}

int wk_kv_secret_read(const char *path, uint8_t *buf, size_t cap, size_t *len_p)
{
    return read_secret(path, buf, cap, len_p) == 0 ? 0 : BATON_EINVAL;
}

int wk_kv_secret_check(const char *path)
{
    uint8_t secret[BATON_XFER_SECRET_MAX + 1];
    size_t len = 0;
    int rc = read_secret(path, secret, sizeof(secret), &len);
    explicit_bzero(secret, sizeof(secret));
    return rc == 0 ? 0 : BATON_EINVAL;
}

int wk_kv_create(wk_kv_t **kv_p, uv_loop_t *loop, const wk_kv_cfg_t *cfg, baton_metrics_t *metrics)
{
    const char *why = NULL;
    if (wk_kvshape_check(&cfg->shape, &why) != 0) {
        log_error(COMP, "kv_start_failed reason=\"%s\"", why);
        return BATON_EINVAL;
    }
    wk_kv_t *kv = calloc(1, sizeof(*kv));
    if (kv == NULL)
        return BATON_ENOMEM;
    kv->loop = loop;
    baton_list_init(&kv->orphans);
    baton_list_init(&kv->tombs);
    baton_list_init(&kv->matched);
    kv->cfg = *cfg;
    kv->token_bytes = wk_kvshape_token_bytes(&cfg->shape);
    kv->page_bytes = wk_kvshape_page_bytes(&cfg->shape);
    uint64_t slots = cfg->pool_tokens / cfg->shape.page_tokens;
    uint64_t region = slots * cfg->shape.layers * kv->page_bytes;
    if (slots == 0 || slots > UINT32_MAX || region / cfg->shape.layers / kv->page_bytes != slots) {
        log_error(COMP, "kv_start_failed reason=\"pool of %" PRIu64 " tokens does not fit\"",
                  cfg->pool_tokens);
        free(kv);
        return BATON_EINVAL;
    }
    kv->n_slots = (uint32_t)slots;
    int rc = wk_kvpool_init(&kv->pool, kv->n_slots);
    if (rc != 0) {
        free(kv);
        return rc;
    }
    baton_xfer_config_t xc;
    baton_xfer_config_init(&xc);
    for (int i = 0; i < cfg->n_transports && i < BATON_XFER_MAX_TRANSPORTS; i++)
        xc.transports[i] = cfg->transports[i];
    xc.n_transports = cfg->n_transports;
    if (cfg->prefill) {
        xc.listen_host = cfg->listen_host;
        xc.listen_port = cfg->listen_port;
        xc.max_pending_conns = cfg->max_pending;
        xc.max_pending_per_addr = cfg->max_pending_per_addr;
        xc.pending_buffer_bytes = cfg->pending_buffer_bytes;
    }
    uint8_t secret[BATON_XFER_SECRET_MAX + 1];
    if (cfg->secret_file != NULL) {
        if (read_secret(cfg->secret_file, secret, sizeof(secret), &xc.secret_len) != 0) {
            wk_kvpool_free(&kv->pool);
            free(kv);
            return BATON_EINVAL;
        }
        xc.secret = secret;
    }
    baton_xfer_callbacks_t cbs = {wk__kv_send_on_room, wk__kv_send_on_room_closed, on_peer, kv};
    rc = baton_xfer_engine_create(loop, &xc, &cbs, &kv->eng);
    explicit_bzero(secret, sizeof(secret)); /* the engine keeps its own copy */
    if (rc != 0) {
        log_error(COMP, "kv_start_failed what=engine err=%s", baton_err_name(rc));
        wk_kvpool_free(&kv->pool);
        free(kv);
        return rc;
    }
    rc = baton_xfer_mem_alloc(kv->eng, region, &kv->mem);
    if (rc != 0) {
        log_error(COMP, "kv_start_failed what=page_region bytes=%" PRIu64 " err=%s", region,
                  baton_err_name(rc));
        /* the engine frees itself on its own loop; the caller exits */
        baton_xfer_engine_destroy(kv->eng, NULL, NULL);
        wk_kvpool_free(&kv->pool);
        free(kv);
        return rc;
    }
    kv->base = baton_xfer_mem_addr(kv->mem);
    if (!cfg->prefill)
        prefault_start(kv, kv->base, region);
    uv_idle_init(loop, &kv->defer);
    kv->defer.data = kv;
    uv_timer_init(loop, &kv->tick);
    kv->tick.data = kv;
    kv->handles_ok = 1;
    if (cfg->prefill) {
        uint64_t every = cfg->timeout_ms / 10;
        every = every < 10 ? 10 : every > 100 ? 100 : every;
        uv_timer_start(&kv->tick, tick_cb, every, every);
    }
    wk__kv_metrics_init(kv, metrics);
    char tps[64];
    baton_xfer_transport_t got[BATON_XFER_MAX_TRANSPORTS];
    int n = baton_xfer_engine_transports(kv->eng, got, BATON_XFER_MAX_TRANSPORTS);
    wk_kv_transport_list(got, n, tps, sizeof(tps));
    log_info(COMP,
             "kv_ready role=%s transports=%s layers=%u kv_heads=%u head_dim=%u dtype_bytes=%u "
             "page_tokens=%u token_bytes=%" PRIu64 " pool_tokens=%" PRIu64 " pool_bytes=%" PRIu64,
             cfg->prefill ? "prefill" : "decode", tps, cfg->shape.layers, cfg->shape.kv_heads,
             cfg->shape.head_dim, cfg->shape.dtype_bytes, cfg->shape.page_tokens, kv->token_bytes,
             slots * cfg->shape.page_tokens, region);
    *kv_p = kv;
    return 0;
}

int wk_kv_listen_port(const wk_kv_t *kv)
{
    return kv->eng ? baton_xfer_engine_listen_port(kv->eng) : 0;
}

const char *wk_kv_engine_id(const wk_kv_t *kv)
{
    return kv->eng ? baton_xfer_engine_id(kv->eng) : "";
}

static void handle_closed(uv_handle_t *h)
{
    wk_kv_t *kv = h->data;
    if (--kv->handles_open > 0)
        return;
    baton_u64map_free(&kv->rooms);
    wk_kvpool_free(&kv->pool);
    wk__kv_recv_free_eps(kv);
    void (*cb)(void *) = kv->close_cb;
    void *arg = kv->close_arg;
    free(kv);
    if (cb)
        cb(arg);
}

static void on_engine_closed(baton_xfer_engine_t *eng, void *data)
{
    wk_kv_t *kv = data;
    kv->eng = NULL;
    /* every room callback has run: whatever is left is a tombstone or an orphan */
    wk__kv_send_engine_closed(kv);
    kv->handles_ok = 0;
    kv->handles_open = 2;
    uv_close((uv_handle_t *)&kv->defer, handle_closed);
    uv_close((uv_handle_t *)&kv->tick, handle_closed);
}

void wk__kv_maybe_destroy_engine(wk_kv_t *kv)
{
    if (!kv->closing || kv->destroying || kv->work_inflight > 0)
        return;
    kv->destroying = 1;
    /* pages are unmapped with the engine: no thread-pool job may touch them past this point */
    baton_xfer_engine_destroy(kv->eng, on_engine_closed, kv);
}

void wk_kv_close(wk_kv_t *kv, void (*cb)(void *arg), void *arg)
{
    if (kv->closing)
        return;
    kv->closing = 1;
    kv->close_cb = cb;
    kv->close_arg = arg;
    uv_idle_stop(&kv->defer);
    uv_timer_stop(&kv->tick);
    wk__kv_send_shutdown(kv);
    wk__kv_maybe_destroy_engine(kv);
}
