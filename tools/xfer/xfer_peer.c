/* tools/xfer/xfer_peer.c — baton-xfer-peer: a libbaton test peer. As prefill it answers
 * every offered room with pattern bytes (layer by layer); as decode it drives rooms of mixed
 * sizes (optionally aborting some), verifies every received byte, checks that released pages
 * stay untouched, and prints the counts. Used by tests/integration/test_transfer.py. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <uv.h>

#include "baton/error.h"
#include "baton/transfer.h"
#include "common/log.h"
#include "xfer_pattern.h"

#define SRC_LEN (8u << 20)

typedef struct {
    int prefill;
    const char *host;
    int port;
    const char *connect_host;
    int connect_port;
    baton_xfer_config_t cfg;
    uint64_t seed;
    uint32_t write_delay_ms;
    /* decode */
    uint32_t rooms;
    uint32_t concurrency;
    uint32_t duration_s;
    uint32_t max_layers, max_ppl, max_page;
    uint32_t abort_pct;
    size_t pool_bytes;
} opts_t;

static opts_t o;
static uv_loop_t *loop;
static baton_xfer_engine_t *eng;
static uint8_t *src;
static baton_xfer_mem_t *src_mem;
static uv_timer_t stats_timer;
static uv_signal_t sig_term, sig_int;
static int stopping;
static uint64_t t_start;

/* counters */
static uint64_t n_ok, n_failed, n_corrupt, n_late, n_bytes, n_started, n_open, n_writes_failed,
    n_peak;
#define MAX_ERR 8
static struct {
    int code;
    uint64_t n;
} errs[MAX_ERR];

static void count_err(int code)
{
    for (int i = 0; i < MAX_ERR; i++) {
        if (errs[i].n == 0 || errs[i].code == code) {
            errs[i].code = code;
            errs[i].n++;
            return;
        }
    }
}

static void fmt_errs(char *buf, size_t cap)
{
    size_t off = 0;
    buf[0] = '\0';
    for (int i = 0; i < MAX_ERR && errs[i].n; i++)
        off += (size_t)snprintf(buf + off, cap - off, "%s%s:%" PRIu64, i ? "," : "",
                                baton_err_name(errs[i].code), errs[i].n);
    if (off == 0)
        snprintf(buf, cap, "-");
}

static void print_stats(const char *what)
{
    char e[512];
    fmt_errs(e, sizeof(e));
    /* One line on stderr (next to the log lines), flushed: the test reads it. */
    fprintf(stderr,
            "%s role=%s ok=%" PRIu64 " failed=%" PRIu64 " corrupt=%" PRIu64 " late=%" PRIu64
            " open=%" PRIu64 " started=%" PRIu64 " bytes=%" PRIu64 " write_errors=%" PRIu64
            " t_ms=%" PRIu64 " peak=%" PRIu64 " errors=%s\n",
            what, o.prefill ? "prefill" : "decode", n_ok, n_failed, n_corrupt, n_late, n_open,
            n_started, n_bytes, n_writes_failed, uv_hrtime() / 1000000 - t_start, n_peak, e);
    fflush(stderr);
}

static void on_engine_closed(baton_xfer_engine_t *e, void *data)
{
    uv_stop(loop);
}

static void shutdown_all(void)
{
    if (stopping)
        return;
    stopping = 1;
    uv_timer_stop(&stats_timer);
    uv_close((uv_handle_t *)&stats_timer, NULL);
    uv_close((uv_handle_t *)&sig_term, NULL);
    uv_close((uv_handle_t *)&sig_int, NULL);
    baton_xfer_engine_destroy(eng, on_engine_closed, NULL);
}

static void on_signal(uv_signal_t *s, int signum)
{
    print_stats("final");
    shutdown_all();
}

/* ---- prefill ------------------------------------------------------------------------------ */

typedef struct {
    baton_xfer_room_t *room;
    uv_timer_t timer;
    uint32_t next_layer;
    int timer_on;
} pctx_t;

static void on_write(baton_xfer_room_t *room, uint32_t layer, int status, void *data)
{
    if (status != 0)
        n_writes_failed++;
}

static int write_layer(pctx_t *c, uint32_t l)
{
    uint32_t ppl = baton_xfer_room_pages_per_layer(c->room);
    baton_xfer_iov_t *iov = malloc(ppl * sizeof(*iov));
    if (iov == NULL)
        return BATON_ENOMEM;
    uint64_t id = baton_xfer_room_id(c->room);
    for (uint32_t j = 0; j < ppl; j++) {
        uint64_t len = baton_xfer_room_page_len(c->room, l, j);
        if (len > SRC_LEN) {
            free(iov);
            return BATON_EINVAL;
        }
        iov[j].addr = src + xfer_src_offset(id, l, j, SRC_LEN, (size_t)len);
        iov[j].len = len;
    }
    int rc = baton_xfer_write_layer(c->room, l, iov, ppl, on_write, c);
    free(iov);
    return rc;
}

static void finish_room(pctx_t *c)
{
    uint64_t id = baton_xfer_room_id(c->room);
    uint8_t payload[8];
    memcpy(payload, &id, 8);
    baton_xfer_done_t done = {0, (int64_t)(id % 50000), payload, sizeof(payload)};
    int rc = baton_xfer_room_complete(c->room, &done);
    if (rc != 0 && rc != BATON_ECANCELED)
        log_warn("xfer-peer", "complete_failed room=%" PRIu64 " err=%s", id, baton_err_name(rc));
}

static void on_layer_timer(uv_timer_t *t)
{
    pctx_t *c = t->data;
    uint32_t layers = baton_xfer_room_layers(c->room);
    int rc = write_layer(c, c->next_layer++);
    if (rc != 0 || c->next_layer == layers) {
        uv_timer_stop(t);
        if (rc == 0)
            finish_room(c);
        else if (rc != BATON_ECANCELED)
            baton_xfer_room_abort(c->room, rc);
    }
}

static void on_room(baton_xfer_engine_t *e, baton_xfer_room_t *room, void *data)
{
    pctx_t *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        baton_xfer_room_abort(room, BATON_ENOMEM);
        return;
    }
    c->room = room;
    baton_xfer_room_set_data(room, c);
    n_started++;
    if (++n_open > n_peak)
        n_peak = n_open;
    if (o.write_delay_ms == 0) {
        uint32_t layers = baton_xfer_room_layers(room);
        for (uint32_t l = 0; l < layers; l++) {
            int rc = write_layer(c, l);
            if (rc != 0) {
                baton_xfer_room_abort(room, rc);
                return;
            }
        }
        finish_room(c);
        return;
    }
    uv_timer_init(loop, &c->timer);
    c->timer.data = c;
    c->timer_on = 1;
    uv_timer_start(&c->timer, on_layer_timer, o.write_delay_ms, o.write_delay_ms);
}

static void free_pctx(uv_handle_t *h)
{
    free(h->data);
}

static void on_room_closed(baton_xfer_engine_t *e, baton_xfer_room_t *room, int status, void *data)
{
    pctx_t *c = baton_xfer_room_get_data(room);
    n_open--;
    if (status == 0) {
        n_ok++;
        uint32_t layers = baton_xfer_room_layers(room), ppl = baton_xfer_room_pages_per_layer(room);
        for (uint32_t l = 0; l < layers; l++)
            for (uint32_t j = 0; j < ppl; j++)
                n_bytes += baton_xfer_room_page_len(room, l, j);
    } else {
        n_failed++;
        count_err(status);
    }
    if (c == NULL)
        return;
    if (c->timer_on) {
        uv_timer_stop(&c->timer);
        uv_close((uv_handle_t *)&c->timer, free_pctx);
    } else {
        free(c);
    }
}

/* ---- decode ------------------------------------------------------------------------------- */

typedef struct droom_s {
    uint64_t id;
    uint32_t layers, ppl, page_len;
    uint32_t *slots;
    uv_timer_t abort_timer;
    int abort_armed;
} droom_t;

static baton_xfer_mem_t *pool_mem;
static uint8_t *pool;
static uint32_t n_slots, slot_size;
static uint32_t *free_q; /* FIFO of free slots: released slots rest at the tail (quarantine) */
static uint32_t fq_head, fq_len;
static uint64_t room_base;
static uv_timer_t kick_timer;
static int kick_armed;

static uint32_t fq_pop(void)
{
    uint32_t s = free_q[fq_head];
    fq_head = (fq_head + 1) % n_slots;
    fq_len--;
    return s;
}

static void fq_push(uint32_t s)
{
    free_q[(fq_head + fq_len) % n_slots] = s;
    fq_len++;
}

static int all_poison(const uint8_t *p, size_t len)
{
    for (size_t i = 0; i < len; i++)
        if (p[i] != XFER_POISON)
            return 0;
    return 1;
}

static void fill_rooms(void);

static void kick_cb(uv_timer_t *t)
{
    kick_armed = 0;
    fill_rooms();
}

static void kick_later(uint32_t ms)
{
    if (kick_armed || stopping)
        return;
    kick_armed = 1;
    uv_timer_start(&kick_timer, kick_cb, ms, 0);
}

static void free_droom(uv_handle_t *h)
{
    droom_t *r = h->data;
    free(r->slots);
    free(r);
}

static void release_room(droom_t *r)
{
    /* The engine guarantees no write for this room can land anymore: poison the pages and put
     * them at the back of the free queue; finding anything but poison when they come back
     * means a late write. */
    for (uint32_t i = 0; i < r->layers * r->ppl; i++) {
        memset(pool + (size_t)r->slots[i] * slot_size, XFER_POISON, slot_size);
        fq_push(r->slots[i]);
    }
    n_open--;
    if (r->abort_armed) {
        uv_timer_stop(&r->abort_timer);
        uv_close((uv_handle_t *)&r->abort_timer, free_droom);
    } else {
        free(r->slots);
        free(r);
    }
}

static void on_offer_done(void *data, uint64_t room_id, int status, const baton_xfer_done_t *done)
{
    droom_t *r = data;
    if (status == 0) {
        int bad = 0;
        for (uint32_t l = 0; l < r->layers && !bad; l++) {
            for (uint32_t j = 0; j < r->ppl; j++) {
                const uint8_t *pg = pool + (size_t)r->slots[l * r->ppl + j] * slot_size;
                size_t off = xfer_src_offset(r->id, l, j, SRC_LEN, r->page_len);
                if (memcmp(pg, src + off, r->page_len) != 0 ||
                    !all_poison(pg + r->page_len, slot_size - r->page_len)) {
                    bad = 1;
                    log_error("xfer-peer",
                              "kv_corrupted room=%" PRIu64 " layer=%" PRIu32 " page=%" PRIu32,
                              r->id, l, j);
                    break;
                }
            }
        }
        uint64_t echoed = 0;
        if (done == NULL || done->payload_len != 8 ||
            (memcpy(&echoed, done->payload, 8), echoed != r->id) ||
            done->first_token != (int64_t)(r->id % 50000) || done->status != 0)
            bad = 1;
        if (bad)
            n_corrupt++;
        else
            n_ok++;
        n_bytes += (uint64_t)r->layers * r->ppl * r->page_len;
    } else {
        n_failed++;
        count_err(status);
    }
    release_room(r);
    if (status != 0 && status != BATON_EABORTED)
        kick_later(20); /* peer trouble: do not spin on fast failures */
    else
        fill_rooms();
}

static void on_abort_timer(uv_timer_t *t)
{
    droom_t *r = t->data;
    baton_xfer_abort(eng, r->id);
}

static int done_starting(void)
{
    if (o.duration_s > 0)
        return uv_hrtime() / 1000000 - t_start >= (uint64_t)o.duration_s * 1000;
    return n_started >= o.rooms;
}

static void maybe_finish(void)
{
    if (done_starting() && n_open == 0 && !stopping) {
        print_stats("result");
        shutdown_all();
    }
}

static void fill_rooms(void)
{
    while (!stopping && !done_starting() && n_open < o.concurrency) {
        droom_t *r = calloc(1, sizeof(*r));
        if (r == NULL)
            break;
        r->id = (room_base + n_started) & INT64_MAX;
        xfer_room_shape(r->id, o.max_layers, o.max_ppl, o.max_page, &r->layers, &r->ppl,
                        &r->page_len);
        uint32_t n = r->layers * r->ppl;
        if (n > fq_len) {
            free(r);
            break; /* wait for pages to come back */
        }
        r->slots = malloc(n * sizeof(uint32_t));
        baton_xfer_iov_t *iov = malloc(n * sizeof(*iov));
        if (r->slots == NULL || iov == NULL) {
            free(r->slots);
            free(iov);
            free(r);
            break;
        }
        for (uint32_t i = 0; i < n; i++) {
            r->slots[i] = fq_pop();
            uint8_t *pg = pool + (size_t)r->slots[i] * slot_size;
            if (!all_poison(pg, slot_size)) {
                n_late++;
                log_error("xfer-peer", "late_write_detected slot=%" PRIu32, r->slots[i]);
                memset(pg, XFER_POISON, slot_size);
            }
            iov[i].addr = pg;
            iov[i].len = r->page_len;
        }
        baton_xfer_offer_t off = {r->id, r->layers, r->ppl, iov, NULL};
        n_started++;
        if (++n_open > n_peak)
            n_peak = n_open;
        int rc = baton_xfer_offer(eng, o.connect_host, o.connect_port, &off, on_offer_done, r);
        free(iov);
        if (rc != 0) {
            n_failed++;
            count_err(rc);
            release_room(r);
            kick_later(20);
            break;
        }
        if (o.abort_pct > 0 && xfer_mix(r->id ^ 0xAB) % 100 < o.abort_pct) {
            uv_timer_init(loop, &r->abort_timer);
            r->abort_timer.data = r;
            r->abort_armed = 1;
            uv_timer_start(&r->abort_timer, on_abort_timer, xfer_mix(r->id) % 4, 0);
        }
    }
    maybe_finish();
}

static void on_peer(baton_xfer_engine_t *e, const baton_xfer_peer_info_t *info, void *data)
{
    static const char *names[] = {"?", "connecting", "up", "down", "gone"};
    log_info("xfer-peer",
             "peer_state endpoint=%s id=%s incarnation=%016" PRIx64
             " state=%s transport=%s reconnects=%" PRIu32 " reason=%s",
             info->endpoint, info->engine_id[0] ? info->engine_id : "-", info->incarnation,
             names[info->state <= 4 ? info->state : 0], baton_xfer_transport_name(info->transport),
             info->reconnects, info->reason ? baton_err_name(info->reason) : "-");
}

static void on_stats_timer(uv_timer_t *t)
{
    print_stats("progress");
    if (!o.prefill)
        fill_rooms();
}

/* ---- main ------------------------------------------------------------------------------- */

static void usage(void)
{
    fprintf(stderr,
            "usage: baton-xfer-peer --role prefill --host H --port P [options]\n"
            "       baton-xfer-peer --role decode --connect H:P [options]\n"
            "common: --transports tcp,shm,rdma  --seed N  --hb-ms N --hb-misses N\n"
            "        --lanes N --slice N --engine-id ID\n"
            "prefill: --write-delay-ms N (per layer)\n"
            "decode: --rooms N | --duration-s N, --concurrency N, --max-layers N, --max-ppl N,\n"
            "        --max-page BYTES, --abort-pct N, --pool-mb N, --room-timeout-ms N\n");
}

static int parse_transports(const char *s)
{
    char buf[64];
    snprintf(buf, sizeof(buf), "%s", s);
    o.cfg.n_transports = 0;
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (o.cfg.n_transports >= BATON_XFER_MAX_TRANSPORTS ||
            baton_xfer_transport_parse(t, &o.cfg.transports[o.cfg.n_transports]) != 0)
            return -1;
        o.cfg.n_transports++;
    }
    return o.cfg.n_transports > 0 ? 0 : -1;
}

int main(int argc, char **argv)
{
    baton_xfer_config_init(&o.cfg);
    o.host = "127.0.0.1";
    o.seed = 42;
    o.rooms = 100;
    o.concurrency = 16;
    o.max_layers = 4;
    o.max_ppl = 8;
    o.max_page = 64 * 1024;
    o.pool_bytes = 64u << 20;
    enum {
        O_ROLE = 1,
        O_HOST,
        O_PORT,
        O_CONNECT,
        O_TP,
        O_SEED,
        O_HB,
        O_MISS,
        O_LANES,
        O_SLICE,
        O_ID,
        O_DELAY,
        O_ROOMS,
        O_CONC,
        O_DUR,
        O_ML,
        O_MP,
        O_MPAGE,
        O_ABORT,
        O_POOL,
        O_RTO
    };
    static const struct option lo[] = {{"role", 1, 0, O_ROLE},
                                       {"host", 1, 0, O_HOST},
                                       {"port", 1, 0, O_PORT},
                                       {"connect", 1, 0, O_CONNECT},
                                       {"transports", 1, 0, O_TP},
                                       {"seed", 1, 0, O_SEED},
                                       {"hb-ms", 1, 0, O_HB},
                                       {"hb-misses", 1, 0, O_MISS},
                                       {"lanes", 1, 0, O_LANES},
                                       {"slice", 1, 0, O_SLICE},
                                       {"engine-id", 1, 0, O_ID},
                                       {"write-delay-ms", 1, 0, O_DELAY},
                                       {"rooms", 1, 0, O_ROOMS},
                                       {"concurrency", 1, 0, O_CONC},
                                       {"duration-s", 1, 0, O_DUR},
                                       {"max-layers", 1, 0, O_ML},
                                       {"max-ppl", 1, 0, O_MP},
                                       {"max-page", 1, 0, O_MPAGE},
                                       {"abort-pct", 1, 0, O_ABORT},
                                       {"pool-mb", 1, 0, O_POOL},
                                       {"room-timeout-ms", 1, 0, O_RTO},
                                       {"help", 0, 0, 'h'},
                                       {0, 0, 0, 0}};
    int role_set = 0, ch;
    while ((ch = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        unsigned long v = optarg ? strtoul(optarg, NULL, 10) : 0;
        switch (ch) {
        case O_ROLE:
            o.prefill = strcmp(optarg, "prefill") == 0;
            role_set = o.prefill || strcmp(optarg, "decode") == 0;
            break;
        case O_HOST:
            o.host = optarg;
            break;
        case O_PORT:
            o.port = (int)v;
            break;
        case O_CONNECT: {
            char *colon = strrchr(optarg, ':');
            if (colon == NULL) {
                usage();
                return 2;
            }
            *colon = '\0';
            o.connect_host = optarg;
            o.connect_port = atoi(colon + 1);
            break;
        }
        case O_TP:
            if (parse_transports(optarg) != 0) {
                fprintf(stderr, "bad --transports %s\n", optarg);
                return 2;
            }
            break;
        case O_SEED:
            o.seed = v;
            break;
        case O_HB:
            o.cfg.heartbeat_interval_ms = (uint32_t)v;
            break;
        case O_MISS:
            o.cfg.heartbeat_misses = (uint32_t)v;
            break;
        case O_LANES:
            o.cfg.lanes = (uint32_t)v;
            break;
        case O_SLICE:
            o.cfg.slice_size = (uint32_t)v;
            break;
        case O_ID:
            o.cfg.engine_id = optarg;
            break;
        case O_DELAY:
            o.write_delay_ms = (uint32_t)v;
            break;
        case O_ROOMS:
            o.rooms = (uint32_t)v;
            break;
        case O_CONC:
            o.concurrency = v ? (uint32_t)v : 1;
            break;
        case O_DUR:
            o.duration_s = (uint32_t)v;
            break;
        case O_ML:
            o.max_layers = v ? (uint32_t)v : 1;
            break;
        case O_MP:
            o.max_ppl = v ? (uint32_t)v : 1;
            break;
        case O_MPAGE:
            o.max_page = v ? (uint32_t)v : 1;
            break;
        case O_ABORT:
            o.abort_pct = (uint32_t)v;
            break;
        case O_POOL:
            o.pool_bytes = (size_t)v << 20;
            break;
        case O_RTO:
            o.cfg.room_timeout_ms = (uint32_t)v;
            break;
        default:
            usage();
            return ch == 'h' ? 0 : 2;
        }
    }
    if (!role_set || (!o.prefill && o.connect_host == NULL) || o.max_page > SRC_LEN) {
        usage();
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    loop = uv_default_loop();
    t_start = uv_hrtime() / 1000000;
    if (o.prefill) {
        o.cfg.listen_host = o.host;
        o.cfg.listen_port = o.port;
    }
    baton_xfer_callbacks_t cbs = {on_room, on_room_closed, on_peer, NULL};
    int rc = baton_xfer_engine_create(loop, &o.cfg, &cbs, &eng);
    if (rc != 0) {
        fprintf(stderr, "engine_create failed: %s\n", baton_strerror(rc));
        return 1;
    }
    src = aligned_alloc(4096, SRC_LEN);
    if (src == NULL)
        return 1;
    xfer_fill_source(src, SRC_LEN, o.seed);
    rc = baton_xfer_mem_register(eng, src, SRC_LEN, BATON_XFER_MEM_HOST, 0, &src_mem);
    if (rc != 0) {
        fprintf(stderr, "mem_register failed: %s\n", baton_strerror(rc));
        return 1;
    }
    if (!o.prefill) {
        slot_size = o.max_page;
        n_slots = (uint32_t)(o.pool_bytes / slot_size);
        if (n_slots < o.max_layers * o.max_ppl) {
            fprintf(stderr, "pool too small for the largest room\n");
            return 2;
        }
        rc = baton_xfer_mem_alloc(eng, (size_t)n_slots * slot_size, &pool_mem);
        if (rc != 0) {
            fprintf(stderr, "mem_alloc failed: %s\n", baton_strerror(rc));
            return 1;
        }
        pool = baton_xfer_mem_addr(pool_mem);
        memset(pool, XFER_POISON, (size_t)n_slots * slot_size);
        free_q = malloc(n_slots * sizeof(uint32_t));
        if (free_q == NULL)
            return 1;
        for (uint32_t i = 0; i < n_slots; i++)
            fq_push(i);
        room_base = xfer_mix(uv_hrtime() ^ (uint64_t)getpid()) & INT64_MAX;
        uv_timer_init(loop, &kick_timer);
        baton_xfer_connect(eng, o.connect_host, o.connect_port);
    }
    uv_timer_init(loop, &stats_timer);
    uv_timer_start(&stats_timer, on_stats_timer, 1000, 1000);
    uv_signal_init(loop, &sig_term);
    uv_signal_start(&sig_term, on_signal, SIGTERM);
    uv_signal_init(loop, &sig_int);
    uv_signal_start(&sig_int, on_signal, SIGINT);
    if (!o.prefill)
        fill_rooms();
    uv_run(loop, UV_RUN_DEFAULT);
    if (!o.prefill) {
        uv_close((uv_handle_t *)&kick_timer, NULL);
        uv_run(loop, UV_RUN_DEFAULT);
    }
    return n_corrupt || n_late ? 3 : 0;
}
