/* xfer/drive.c — baton-xfer-bench's decode side: starts the server process, offers rooms per
 * case (warm-up, throughput runs with a window of rooms in flight, one-at-a-time latency runs),
 * times them, checks the received bytes, and records CPU time of both processes. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <infiniband/verbs.h>
#include <uv.h>

#include "common/log.h"
#include "xbench.h"

/*
 * The driver is written as straight-line code over its own loop: each phase starts rooms and
 * then runs the loop (pump_until) until the phase's rooms are back. Rooms are refilled from
 * the offer callback itself, so the window never waits for the driver to be scheduled.
 */

typedef struct {
    uint32_t index;
    uint64_t room_id; /* last room offered into this slot (0: never) */
    uint64_t t_start;
    int busy;
    int checked; /* room_id's bytes were verified already */
} slot_t;

typedef struct {
    const xb_opts_t *o;
    const xb_case_t *c;
    const uint8_t *src;
    uint8_t *pool;
    uint32_t n_slots;
    slot_t *slots;
    uint32_t *free_q;
    uint32_t n_free;
    baton_xfer_iov_t *iov;
    /* the current phase */
    uint32_t window;
    uint32_t inflight;
    uint64_t started, done, min_rooms, max_rooms;
    uint64_t bytes_started, bytes_target, bytes_done;
    uint64_t deadline_ns, last_done_ns;
    int stopped;
    int verify_each;
    double *lat;
    size_t n_lat, cap_lat;
    int err;
    /* totals of the case */
    uint64_t verified_rooms, verified_bytes, corrupt_rooms;
} xrun_t;

static uv_loop_t *dloop;
static baton_xfer_engine_t *deng;
static uv_timer_t tick;
static const char *d_host;
static int d_port;
static int peer_state, peer_tp, peer_reason;
static int engine_closed;
static uint64_t next_room;

/* ---- loop helpers ------------------------------------------------------------------------ */

static void on_tick(uv_timer_t *t)
{
    (void)t; /* only wakes uv_run(ONCE) so deadlines are checked */
}

typedef int (*pred_fn)(void *arg);

/* Runs the loop until pred(arg) holds; BATON_ETIMEOUT after timeout_ms. */
static int pump_until(pred_fn pred, void *arg, uint64_t timeout_ms)
{
    uint64_t deadline = xb_now_ns() + timeout_ms * 1000000ull;
    while (!pred(arg)) {
        if (xb_now_ns() > deadline)
            return BATON_ETIMEOUT;
        uv_run(dloop, UV_RUN_ONCE);
    }
    return 0;
}

static void on_peer(baton_xfer_engine_t *e, const baton_xfer_peer_info_t *info, void *data)
{
    peer_state = info->state;
    peer_tp = info->transport;
    peer_reason = info->reason;
}

static int peer_settled(void *arg)
{
    return peer_state == BATON_XFER_PEER_UP || peer_state == BATON_XFER_PEER_DOWN;
}

static void on_engine_closed(baton_xfer_engine_t *e, void *data)
{
    engine_closed = 1;
}

static int is_closed(void *arg)
{
    return engine_closed;
}

/* ---- the server process ---------------------------------------------------------------- */

static int spawn_server(const xb_opts_t *o, baton_xfer_transport_t tp, pid_t *pid_p, int *port_p)
{
    int pfd[2];
    if (pipe(pfd) != 0)
        return -errno;
    fcntl(pfd[0], F_SETFD, FD_CLOEXEC);
    char fdbuf[16], srcbuf[32], seedbuf[32], slicebuf[32], lanesbuf[16];
    snprintf(fdbuf, sizeof(fdbuf), "%d", pfd[1]);
    snprintf(srcbuf, sizeof(srcbuf), "%zu", o->src_bytes >> 20);
    snprintf(seedbuf, sizeof(seedbuf), "%" PRIu64, o->seed);
    snprintf(slicebuf, sizeof(slicebuf), "%" PRIu32, o->slice);
    snprintf(lanesbuf, sizeof(lanesbuf), "%" PRIu32, o->lanes);
    const char *argv[24];
    int n = 0;
    argv[n++] = "baton-xfer-bench";
    argv[n++] = "--serve";
    argv[n++] = "--transports";
    argv[n++] = baton_xfer_transport_name(tp);
    argv[n++] = "--listen";
    argv[n++] = "127.0.0.1:0";
    argv[n++] = "--notify-fd";
    argv[n++] = fdbuf;
    argv[n++] = "--src-mb";
    argv[n++] = srcbuf;
    argv[n++] = "--seed";
    argv[n++] = seedbuf;
    argv[n++] = "--log-level";
    argv[n++] = o->log_lvl;
    if (o->slice) {
        argv[n++] = "--slice";
        argv[n++] = slicebuf;
    }
    if (o->lanes) {
        argv[n++] = "--lanes";
        argv[n++] = lanesbuf;
    }
    argv[n] = NULL;
    fflush(stdout);
    fflush(stderr);
    /* Exec the same binary by its real path, so the server shows up under its own name. */
    char exe[4096];
    ssize_t el = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (el <= 0) {
        close(pfd[0]);
        close(pfd[1]);
        return BATON_ENOTFOUND;
    }
    exe[el] = '\0';
    pid_t pid = fork();
    if (pid < 0) {
        int e = errno;
        close(pfd[0]);
        close(pfd[1]);
        return -e;
    }
    if (pid == 0) {
        close(pfd[0]);
        execv(exe, (char *const *)argv);
        _exit(127);
    }
    close(pfd[1]);
    char line[64] = "";
    size_t len = 0;
    uint64_t deadline = xb_now_ns() + 30000000000ull;
    while (len < sizeof(line) - 1 && memchr(line, '\n', len) == NULL) {
        struct pollfd p = {pfd[0], POLLIN, 0};
        int left = (int)((deadline - xb_now_ns()) / 1000000);
        if (xb_now_ns() >= deadline || poll(&p, 1, left > 0 ? left : 0) <= 0)
            break;
        ssize_t r = read(pfd[0], line + len, sizeof(line) - 1 - len);
        if (r <= 0)
            break;
        len += (size_t)r;
        line[len] = '\0';
    }
    close(pfd[0]);
    int port = 0;
    if (sscanf(line, "port=%d", &port) != 1 || port <= 0) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        return BATON_EPROTO;
    }
    *pid_p = pid;
    *port_p = port;
    return 0;
}

static void stop_server(pid_t pid)
{
    if (pid <= 0)
        return;
    kill(pid, SIGTERM);
    for (int i = 0; i < 100; i++) {
        if (waitpid(pid, NULL, WNOHANG) == pid)
            return;
        usleep(50000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

/* ---- rooms ------------------------------------------------------------------------------- */

static uint8_t *page_addr(xrun_t *r, uint32_t slot, uint32_t layer, uint32_t page)
{
    const xb_case_t *c = r->c;
    return r->pool + (size_t)slot * c->room_bytes +
           ((size_t)layer * c->ppl + page) * (size_t)c->page_len;
}

/* Compares every page of the slot's last room with the pattern. Returns 1 when all match. */
static int verify_slot(xrun_t *r, slot_t *s)
{
    const xb_case_t *c = r->c;
    int ok = 1;
    for (uint32_t l = 0; l < c->n_layers && ok; l++) {
        for (uint32_t j = 0; j < c->ppl; j++) {
            size_t off = xb_src_offset(s->room_id, l, j, r->o->src_bytes, c->page_len);
            if (memcmp(page_addr(r, s->index, l, j), r->src + off, c->page_len) != 0) {
                log_error("xfer-bench",
                          "kv_corrupted case=%s room=%" PRIu64 " layer=%" PRIu32 " page=%" PRIu32,
                          c->name, s->room_id, l, j);
                ok = 0;
                break;
            }
        }
    }
    s->checked = 1;
    r->verified_rooms++;
    r->verified_bytes += c->room_bytes;
    if (!ok)
        r->corrupt_rooms++;
    return ok;
}

static void fill(xrun_t *r);
static xrun_t *cur_run;

static void on_offer_done(void *data, uint64_t room_id, int status, const baton_xfer_done_t *done)
{
    slot_t *s = data;
    xrun_t *r = cur_run; /* one phase at a time */
    uint64_t now = xb_now_ns();
    s->busy = 0;
    r->inflight--;
    r->done++;
    r->free_q[r->n_free++] = s->index;
    if (status != 0) {
        if (r->err == 0) {
            r->err = status;
            log_error("xfer-bench", "room_failed case=%s room=%" PRIu64 " err=%s", r->c->name,
                      room_id, baton_err_name(status));
        }
        r->stopped = 1;
        return;
    }
    r->last_done_ns = now;
    r->bytes_done += r->c->room_bytes;
    if (r->n_lat < r->cap_lat)
        r->lat[r->n_lat++] = (double)(now - s->t_start) / 1000.0;
    uint64_t echo_id = 0, echo_pages = 0;
    if (done != NULL && done->payload_len == XB_DONE_PAYLOAD) {
        memcpy(&echo_id, done->payload, 8);
        memcpy(&echo_pages, done->payload + 8, 8);
    }
    if (done == NULL || done->status != 0 || echo_id != room_id ||
        echo_pages != (uint64_t)r->c->n_layers * r->c->ppl ||
        done->first_token != (int64_t)(room_id % 50000)) {
        log_error("xfer-bench", "done_payload_mismatch case=%s room=%" PRIu64, r->c->name, room_id);
        r->corrupt_rooms++;
    }
    s->checked = 0;
    if (r->verify_each)
        verify_slot(r, s);
    fill(r);
}

static int start_room(xrun_t *r)
{
    const xb_case_t *c = r->c;
    uint32_t si = r->free_q[--r->n_free];
    slot_t *s = &r->slots[si];
    s->room_id = ++next_room;
    uint32_t k = 0;
    for (uint32_t l = 0; l < c->n_layers; l++)
        for (uint32_t j = 0; j < c->ppl; j++) {
            r->iov[k].addr = page_addr(r, si, l, j);
            r->iov[k].len = c->page_len;
            k++;
        }
    baton_xfer_offer_t off = {s->room_id, c->n_layers, c->ppl, r->iov, NULL};
    s->busy = 1;
    s->t_start = xb_now_ns();
    int rc = baton_xfer_offer(deng, d_host, d_port, &off, on_offer_done, s);
    if (rc != 0) {
        r->free_q[r->n_free++] = si;
        return rc;
    }
    r->inflight++;
    r->started++;
    r->bytes_started += c->room_bytes;
    return 0;
}

static void fill(xrun_t *r)
{
    while (!r->stopped && r->inflight < r->window && r->n_free > 0) {
        if (r->started >= r->max_rooms ||
            (r->started >= r->min_rooms &&
             (r->bytes_started >= r->bytes_target || xb_now_ns() >= r->deadline_ns))) {
            r->stopped = 1;
            break;
        }
        int rc = start_room(r);
        if (rc != 0) {
            log_error("xfer-bench", "offer_failed case=%s err=%s", r->c->name, baton_err_name(rc));
            r->err = rc;
            r->stopped = 1;
        }
    }
}

static int run_over(void *arg)
{
    xrun_t *r = arg;
    return r->stopped && r->inflight == 0;
}

typedef struct {
    double wall_s, gbps, rooms_per_s, cpu_self, cpu_server;
    uint64_t rooms, bytes;
} phase_t;

/* One phase: rooms with `window` in flight until min/max rooms, bytes or time say stop. */
static int run_phase(xrun_t *r, uint32_t window, uint64_t min_rooms, uint64_t max_rooms,
                     uint64_t bytes_target, uint32_t ms, int verify_each, pid_t server, phase_t *ph)
{
    r->window = window;
    r->inflight = 0;
    r->started = r->done = 0;
    r->min_rooms = min_rooms;
    r->max_rooms = max_rooms;
    r->bytes_started = r->bytes_done = 0;
    r->bytes_target = bytes_target;
    r->stopped = 0;
    r->verify_each = verify_each;
    r->n_lat = 0;
    r->err = 0;
    cur_run = r;
    double c0 = xb_cpu_self(), s0 = server > 0 ? xb_cpu_pid(server) : -1;
    uint64_t t0 = xb_now_ns();
    r->deadline_ns = t0 + (uint64_t)ms * 1000000ull;
    r->last_done_ns = t0;
    fill(r);
    /* Generous: a phase is bounded by its own deadline; this only catches a stuck engine. */
    int rc = pump_until(run_over, r, (uint64_t)ms + 120000);
    double c1 = xb_cpu_self(), s1 = server > 0 ? xb_cpu_pid(server) : -1;
    if (rc != 0) {
        log_error("xfer-bench", "phase_stuck case=%s inflight=%" PRIu32, r->c->name, r->inflight);
        return rc;
    }
    if (r->err != 0)
        return r->err;
    if (ph != NULL) {
        ph->wall_s = (double)(r->last_done_ns - t0) / 1e9;
        ph->rooms = r->done;
        ph->bytes = r->bytes_done;
        ph->gbps = ph->wall_s > 0 ? (double)r->bytes_done / ph->wall_s / 1e9 : 0;
        ph->rooms_per_s = ph->wall_s > 0 ? (double)r->done / ph->wall_s : 0;
        ph->cpu_self = c1 - c0;
        ph->cpu_server = s0 >= 0 && s1 >= 0 ? s1 - s0 : -1;
    }
    return 0;
}

/* Verifies the last room of every slot not verified yet (untimed, between runs). */
static void verify_slots(xrun_t *r)
{
    for (uint32_t i = 0; i < r->n_slots; i++)
        if (r->slots[i].room_id != 0 && !r->slots[i].checked)
            verify_slot(r, &r->slots[i]);
}

static json_t *lat_json(double *v, size_t n)
{
    if (n == 0)
        return json_null();
    double sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += v[i];
    xb_median(v, n); /* sorts */
    return json_pack("{s:I, s:f, s:f, s:f, s:f, s:f}", "n", (json_int_t)n, "p50",
                     xb_percentile(v, n, 50), "p99", xb_percentile(v, n, 99), "mean",
                     sum / (double)n, "min", v[0], "max", v[n - 1]);
}

static int append(double **a, size_t *n, size_t *cap, const double *v, size_t k)
{
    if (*n + k > *cap) {
        size_t nc = (*n + k) * 2;
        double *x = realloc(*a, nc * sizeof(double));
        if (x == NULL)
            return -1;
        *a = x;
        *cap = nc;
    }
    memcpy(*a + *n, v, k * sizeof(double));
    *n += k;
    return 0;
}

/* Runs one case on the connected engine; returns its JSON object (NULL: out of memory). */
static json_t *run_case(const xb_opts_t *o, const xb_case_t *c, const uint8_t *src, pid_t server,
                        int *status_p)
{
    json_t *j = json_pack("{s:s, s:s, s:I, s:i, s:i, s:I, s:i}", "case", c->name, "kind", c->kind,
                          "room_bytes", (json_int_t)c->room_bytes, "layers", (int)c->n_layers,
                          "pages_per_layer", (int)c->ppl, "page_bytes", (json_int_t)c->page_len,
                          "window", (int)c->window);
    if (c->tokens)
        json_object_set_new(j, "tokens", json_integer(c->tokens));
    xrun_t r;
    memset(&r, 0, sizeof(r));
    r.o = o;
    r.c = c;
    r.src = src;
    r.n_slots = c->window;
    baton_xfer_mem_t *pool_mem = NULL;
    int rc = baton_xfer_mem_alloc(deng, (size_t)r.n_slots * c->room_bytes, &pool_mem);
    if (rc != 0) {
        json_object_set_new(j, "error", json_string(baton_strerror(rc)));
        *status_p = 1;
        return j;
    }
    r.pool = baton_xfer_mem_addr(pool_mem);
    /* Touch every destination page now: the runs measure a warm KV pool, as a decode server
     * has (first-touch costs are what the memcpy baseline's first_touch figure shows). */
    memset(r.pool, XFER_POISON, (size_t)r.n_slots * c->room_bytes);
    r.slots = calloc(r.n_slots, sizeof(*r.slots));
    r.free_q = calloc(r.n_slots, sizeof(*r.free_q));
    r.iov = calloc((size_t)c->n_layers * c->ppl, sizeof(*r.iov));
    r.cap_lat = 1u << 20;
    r.lat = malloc(r.cap_lat * sizeof(double));
    double *tput = calloc(o->runs > o->kv_runs ? o->runs : o->kv_runs, sizeof(double));
    double *rps = calloc(o->runs > o->kv_runs ? o->runs : o->kv_runs, sizeof(double));
    double *lat_all = NULL, *lat_loaded = NULL;
    size_t n_all = 0, cap_all = 0, n_loaded = 0, cap_loaded = 0;
    json_t *runs_j = json_array();
    if (r.slots == NULL || r.free_q == NULL || r.iov == NULL || r.lat == NULL || tput == NULL ||
        rps == NULL) {
        rc = BATON_ENOMEM;
        goto out;
    }
    for (uint32_t i = 0; i < r.n_slots; i++) {
        r.slots[i].index = i;
        r.free_q[r.n_free++] = r.n_slots - 1 - i;
    }
    int is_kv = strcmp(c->kind, "kv") == 0;
    int verify_all = o->verify == XB_VERIFY_ALL;
    double cpu_self = 0, cpu_srv = 0, wall = 0, bytes = 0;
    int srv_ok = 1;

    /* Warm-up: connections' windows open, the writer's mappings fault in, caches settle. */
    uint64_t wu = is_kv ? 1 : o->warmup_rooms > c->window ? o->warmup_rooms : c->window;
    rc = run_phase(&r, c->window, wu, wu, UINT64_MAX, UINT32_MAX / 2, o->verify != XB_VERIFY_NONE,
                   server, NULL);
    if (rc != 0)
        goto out;
    /* The first room on a fresh pool: the writer side has not touched these pages yet (shm:
     * its mapping faults in; tcp: socket buffers and windows grow). Excluded from the runs. */
    if (r.n_lat > 0)
        json_object_set_new(j, "first_room_us", json_real(r.lat[0]));

    uint32_t runs = is_kv ? o->kv_runs : o->runs;
    for (uint32_t i = 0; i < runs; i++) {
        phase_t ph;
        if (is_kv)
            rc = run_phase(&r, 1, 1, 1, UINT64_MAX, UINT32_MAX / 2, verify_all, server, &ph);
        else
            rc = run_phase(&r, c->window, c->window, UINT64_MAX, o->run_bytes, o->run_ms,
                           verify_all, server, &ph);
        if (rc != 0)
            goto out;
        tput[i] = ph.gbps;
        rps[i] = ph.rooms_per_s;
        cpu_self += ph.cpu_self;
        if (ph.cpu_server < 0)
            srv_ok = 0;
        cpu_srv += ph.cpu_server;
        wall += ph.wall_s;
        bytes += (double)ph.bytes;
        json_array_append_new(runs_j, json_pack("{s:f, s:I, s:I, s:f}", "gbps", ph.gbps, "rooms",
                                                (json_int_t)ph.rooms, "bytes", (json_int_t)ph.bytes,
                                                "wall_s", ph.wall_s));
        if (append(is_kv ? &lat_all : &lat_loaded, is_kv ? &n_all : &n_loaded,
                   is_kv ? &cap_all : &cap_loaded, r.lat, r.n_lat) != 0) {
            rc = BATON_ENOMEM;
            goto out;
        }
        if (o->verify == XB_VERIFY_SAMPLE)
            verify_slots(&r);
        if (!is_kv) {
            /* Unloaded latency: one room at a time. */
            rc = run_phase(&r, 1, 3, o->lat_rooms, UINT64_MAX, o->lat_ms, verify_all, server, NULL);
            if (rc != 0)
                goto out;
            if (append(&lat_all, &n_all, &cap_all, r.lat, r.n_lat) != 0) {
                rc = BATON_ENOMEM;
                goto out;
            }
            if (o->verify == XB_VERIFY_SAMPLE)
                verify_slots(&r);
        }
    }
    double gmin = tput[0], gmax = tput[0];
    for (uint32_t i = 1; i < runs; i++) {
        gmin = tput[i] < gmin ? tput[i] : gmin;
        gmax = tput[i] > gmax ? tput[i] : gmax;
    }
    json_object_set_new(j, "gbps", json_real(xb_median(tput, runs)));
    json_object_set_new(j, "gbps_min", json_real(gmin));
    json_object_set_new(j, "gbps_max", json_real(gmax));
    json_object_set_new(j, "rooms_per_s", json_real(xb_median(rps, runs)));
    json_object_set_new(j, "lat_us", lat_json(lat_all, n_all));
    if (!is_kv)
        json_object_set_new(j, "loaded_lat_us", lat_json(lat_loaded, n_loaded));
    json_object_set_new(
        j, "cpu_pct",
        json_pack("{s:f, s:o}", "driver", wall > 0 ? 100 * cpu_self / wall : 0, "server",
                  srv_ok && wall > 0 ? json_real(100 * cpu_srv / wall) : json_null()));
    /* CPU seconds of both processes per GB moved: steadier than GB/s when other work shares
     * the CPUs (it still rises a little with cache and scheduler contention). */
    if (srv_ok && bytes > 0)
        json_object_set_new(j, "cpu_s_per_gb", json_real((cpu_self + cpu_srv) / (bytes / 1e9)));
out:
    json_object_set_new(j, "runs", runs_j);
    json_object_set_new(j, "verified_rooms", json_integer((json_int_t)r.verified_rooms));
    json_object_set_new(j, "verified_bytes", json_integer((json_int_t)r.verified_bytes));
    json_object_set_new(j, "corrupt_rooms", json_integer((json_int_t)r.corrupt_rooms));
    if (rc != 0) {
        json_object_set_new(j, "error", json_string(baton_err_name(rc)));
        *status_p = 1;
    }
    if (r.corrupt_rooms > 0)
        *status_p = 3;
    free(lat_all);
    free(lat_loaded);
    free(tput);
    free(rps);
    free(r.lat);
    free(r.iov);
    free(r.free_q);
    free(r.slots);
    /* Only after every room of the pool has called back (a stuck phase keeps it: the engine
     * releases it at shutdown). */
    if (r.inflight == 0) {
        int drc = baton_xfer_mem_deregister(deng, pool_mem);
        if (drc != 0)
            log_warn("xfer-bench", "pool_deregister_failed err=%s", baton_err_name(drc));
    }
    return j;
}

/* Why an RDMA engine cannot start here, for the report. */
static void rdma_reason(char *buf, size_t cap)
{
    int n = 0;
    errno = 0;
    struct ibv_device **l = ibv_get_device_list(&n);
    int e = errno;
    if (l == NULL)
        snprintf(buf, cap, "no RDMA device: ibv_get_device_list failed (%s)",
                 e ? strerror(e) : "no kernel RDMA support");
    else if (n == 0)
        snprintf(buf, cap, "no RDMA device: ibv_get_device_list found none");
    else
        snprintf(buf, cap, "%d RDMA device(s) listed but none usable (see the log)", n);
    if (l != NULL)
        ibv_free_device_list(l);
}

int xb_drive_transport(const xb_opts_t *o, baton_xfer_transport_t tp, const xb_case_t *cases,
                       int n_cases, const uint8_t *src, json_t *out)
{
    const char *name = baton_xfer_transport_name(tp);
    json_t *tj = json_pack("{s:s}", "transport", name);
    json_array_append_new(out, tj);
    json_t *cj = json_array();
    json_object_set_new(tj, "cases", cj);
    dloop = uv_default_loop();
    peer_state = 0;
    engine_closed = 0;
    if (next_room == 0)
        next_room = (xfer_mix(xb_now_ns() ^ (uint64_t)getpid()) & 0x3fffffffffffffffull) | 1;

    baton_xfer_config_t cfg;
    baton_xfer_config_init(&cfg);
    cfg.transports[0] = tp;
    cfg.n_transports = 1;
    if (o->slice)
        cfg.slice_size = o->slice;
    if (o->lanes)
        cfg.lanes = o->lanes;
    cfg.engine_id = "xfer-bench-driver";
    baton_xfer_callbacks_t cbs = {NULL, NULL, on_peer, NULL};
    int rc = baton_xfer_engine_create(dloop, &cfg, &cbs, &deng);
    if (rc != 0) {
        char why[256];
        if (tp == BATON_XFER_TRANSPORT_RDMA)
            rdma_reason(why, sizeof(why));
        else
            snprintf(why, sizeof(why), "engine_create: %s", baton_strerror(rc));
        json_object_set_new(tj, "status", json_string("unavailable"));
        json_object_set_new(tj, "error", json_string(why));
        if (!o->quiet)
            fprintf(stderr, "xfer-bench: %s not measurable here: %s\n", name, why);
        return 0;
    }
    uv_timer_init(dloop, &tick);
    uv_timer_start(&tick, on_tick, 20, 20);

    pid_t server = 0;
    int status = 0;
    if (o->connect_host != NULL) {
        d_host = o->connect_host;
        d_port = o->connect_port;
    } else {
        int port = 0;
        rc = spawn_server(o, tp, &server, &port);
        if (rc != 0) {
            json_object_set_new(tj, "status", json_string("failed"));
            json_object_set_new(tj, "error", json_string("the server process did not start"));
            status = 1;
            goto done;
        }
        d_host = "127.0.0.1";
        d_port = port;
    }
    baton_xfer_connect(deng, d_host, d_port);
    if (pump_until(peer_settled, NULL, 15000) != 0 || peer_state != BATON_XFER_PEER_UP ||
        peer_tp != (int)tp) {
        char why[160];
        snprintf(why, sizeof(why), "peer not up over %s (state %d, transport %s, reason %s)", name,
                 peer_state, baton_xfer_transport_name((baton_xfer_transport_t)peer_tp),
                 peer_reason ? baton_err_name(peer_reason) : "-");
        json_object_set_new(tj, "status", json_string("failed"));
        json_object_set_new(tj, "error", json_string(why));
        if (!o->quiet)
            fprintf(stderr, "xfer-bench: %s\n", why);
        status = 1;
        goto done;
    }
    if (!o->quiet)
        fprintf(stderr, "xfer-bench: %s: measuring %d cases\n", name, n_cases);
    uint64_t vb = 0, vr = 0, cr = 0;
    for (int i = 0; i < n_cases; i++) {
        int st = 0;
        json_t *one = run_case(o, &cases[i], src, server, &st);
        if (one == NULL) {
            status = 1;
            break;
        }
        vb += (uint64_t)json_integer_value(json_object_get(one, "verified_bytes"));
        vr += (uint64_t)json_integer_value(json_object_get(one, "verified_rooms"));
        cr += (uint64_t)json_integer_value(json_object_get(one, "corrupt_rooms"));
        json_array_append_new(cj, one);
        if (!o->quiet) {
            json_t *g = json_object_get(one, "gbps");
            fprintf(stderr, "xfer-bench: %s %-8s %s %.3f GB/s\n", name, cases[i].name,
                    g ? "median" : "error", g ? json_real_value(g) : 0.0);
        }
        if (st != 0 && (status == 0 || st == 3))
            status = st;
        if (st == 1 && peer_state != BATON_XFER_PEER_UP)
            break; /* the peer went away: the next cases cannot run */
    }
    json_object_set_new(tj, "verified_bytes", json_integer((json_int_t)vb));
    json_object_set_new(tj, "verified_rooms", json_integer((json_int_t)vr));
    json_object_set_new(tj, "corrupt_rooms", json_integer((json_int_t)cr));
    json_object_set_new(tj, "status", json_string(status == 0 ? "ok" : "failed"));
done:
    baton_xfer_engine_destroy(deng, on_engine_closed, NULL);
    pump_until(is_closed, NULL, 30000);
    deng = NULL;
    uv_timer_stop(&tick);
    uv_close((uv_handle_t *)&tick, NULL);
    uv_run(dloop, UV_RUN_NOWAIT);
    stop_server(server);
    return status;
}
