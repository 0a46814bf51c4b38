/* store/bench.c — `baton-store bench`: batches of puts and gets through the public client API,
 * every byte compared, throughput per round beside this host's memcpy; with --duration-s it keeps
 * going through faults (a stopped master, a killed node) and counts what failed and what came back
 * wrong (never anything: a get fails rather than return bytes that may be stale). */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/rand.h"
#include "store/sconn.h"

int baton__parse_hostport(const char *s, char *host, size_t cap, int *port_p);

typedef struct {
    const char *master, *host, *secret_file, *ns;
    uint64_t size;
    uint32_t batch, rounds, replicas, duration_s, keys, interval_ms;
    uint32_t reads, reads_left; /* gets of each round's batch (after the first: located) */
    uint32_t read_interval_ms;  /* pause between them */
    uint64_t last_print_ms;
    uint8_t secret[BATON_XFER_SECRET_MAX];
    size_t secret_len;
    baton_xfer_transport_t transport; /* tried first; tcp after it */
    uv_loop_t *loop;
    baton_xfer_engine_t *eng;
    baton_store_client_t *cl;
    baton_xfer_mem_t *src, *dst;
    baton_store_obj_t *objs;
    char (*keys_buf)[64];
    uint64_t round, gen;
    uint64_t t0;
    int phase; /* 0 put, 1 get */
    uint64_t put_ok, put_failed, get_ok, get_failed, missing, corrupted;
    uint64_t bytes_put, bytes_got;
    double put_s, get_s;
    uint64_t deadline_ms;
    int last_error;
    uv_timer_t pause;
} bench_t;

/* The bytes of object i of generation g: distinct per object and generation. */
static void fill(uint8_t *p, uint64_t len, uint64_t g, uint32_t i)
{
    uint64_t x = baton_mix64(g * 1000003u + i + 1);
    for (uint64_t o = 0; o < len; o += 8) {
        x = baton_xorshift64s(&x);
        memcpy(p + o, &x, len - o < 8 ? len - o : 8);
    }
}

static void next_round(bench_t *b);

static void on_pause(uv_timer_t *t)
{
    next_round(t->data);
}

static void round_done(bench_t *b)
{
    uint64_t now = baton_now_ms();
    int print = !b->duration_s || b->last_error || now - b->last_print_ms >= 500;
    double put_gbps = b->put_s > 0 ? (double)b->bytes_put / b->put_s / 1e9 : 0;
    double get_gbps = b->get_s > 0 ? (double)b->bytes_got / b->get_s / 1e9 : 0;
    if (print)
        printf("{\"round\":%llu,\"put_ok\":%llu,\"put_failed\":%llu,\"get_ok\":%llu,"
               "\"get_failed\":%llu,\"corrupted\":%llu,\"put_GBps\":%.3f,\"get_GBps\":%.3f,"
               "\"last_error\":\"%s\"}\n",
               (unsigned long long)b->round, (unsigned long long)b->put_ok,
               (unsigned long long)b->put_failed, (unsigned long long)b->get_ok,
               (unsigned long long)b->get_failed, (unsigned long long)b->corrupted, put_gbps,
               get_gbps, b->last_error ? baton_store_strerror(b->last_error) : "");
    if (print) {
        fflush(stdout);
        b->last_print_ms = now;
    }
    b->round++;
    int more = b->duration_s ? baton_now_ms() < b->deadline_ms : b->round < b->rounds;
    if (!more) {
        uv_stop(b->loop);
        return;
    }
    /* after a failed round, a short pause instead of a busy loop against a stopped master */
    uv_timer_start(&b->pause, on_pause, b->last_error ? 100 : b->interval_ms, 0);
}

static void on_get(void *data, int status, const baton_store_result_t *res, size_t n,
                   size_t prefix);
static void start_get(bench_t *b);

static void on_read_pause(uv_timer_t *t)
{
    start_get(t->data);
}

static void start_get(bench_t *b)
{
    b->reads_left--;
    memset(baton_xfer_mem_addr(b->dst), 0, (size_t)b->size * b->batch);
    b->t0 = uv_hrtime();
    int rc = baton_store_get(b->cl, b->objs, b->batch, on_get, b);
    if (rc != 0) {
        b->get_failed += b->batch;
        b->last_error = rc;
        round_done(b);
    }
}

static void on_get(void *data, int status, const baton_store_result_t *res, size_t n, size_t prefix)
{
    bench_t *b = data;
    (void)prefix;
    b->get_s += (double)(uv_hrtime() - b->t0) / 1e9;
    uint8_t *dst = baton_xfer_mem_addr(b->dst);
    uint8_t *want = malloc(b->size);
    for (size_t i = 0; i < n; i++) {
        int st = status ? status : res[i].status;
        if (st == BATON_XFER_ENOTFOUND) {
            b->missing++;
            continue;
        }
        if (st != 0) {
            b->get_failed++;
            b->last_error = st;
            continue;
        }
        fill(want, b->size, b->gen, (uint32_t)i);
        if (res[i].len != b->size || memcmp(dst + i * b->size, want, b->size) != 0) {
            b->corrupted++;
            continue;
        }
        b->get_ok++;
        b->bytes_got += b->size;
    }
    free(want);
    if (b->reads_left > 0 && status == 0 && b->read_interval_ms)
        uv_timer_start(&b->pause, on_read_pause, b->read_interval_ms, 0);
    else if (b->reads_left > 0 && status == 0)
        start_get(b);
    else
        round_done(b);
}

static void on_put(void *data, int status, const baton_store_result_t *res, size_t n, size_t prefix)
{
    bench_t *b = data;
    (void)prefix;
    b->put_s += (double)(uv_hrtime() - b->t0) / 1e9;
    int any = 0;
    for (size_t i = 0; i < n; i++) {
        int st = status ? status : res[i].status;
        if (st == 0) {
            b->put_ok++;
            b->bytes_put += b->size;
            any = 1;
        } else {
            b->put_failed++;
            b->last_error = st;
        }
    }
    if (!any) {
        round_done(b);
        return;
    }
    for (uint32_t i = 0; i < b->batch; i++)
        b->objs[i].addr = (uint8_t *)baton_xfer_mem_addr(b->dst) + (uint64_t)i * b->size;
    b->reads_left = b->reads;
    start_get(b);
}

static void next_round(bench_t *b)
{
    b->last_error = 0;
    b->gen = b->round;
    uint8_t *src = baton_xfer_mem_addr(b->src);
    for (uint32_t i = 0; i < b->batch; i++) {
        fill(src + (uint64_t)i * b->size, b->size, b->gen, i);
        snprintf(b->keys_buf[i], sizeof(b->keys_buf[i]), "bench-%d-%llu-%u", (int)getpid(),
                 (unsigned long long)b->round, i);
        b->objs[i] = (baton_store_obj_t){b->keys_buf[i], src + (uint64_t)i * b->size, b->size};
    }
    baton_store_put_opts_t po;
    baton_store_put_opts_init(&po);
    po.replicas = b->replicas;
    b->t0 = uv_hrtime();
    int rc = baton_store_put(b->cl, b->objs, b->batch, &po, on_put, b);
    if (rc != 0) {
        b->put_failed += b->batch;
        b->last_error = rc;
        round_done(b);
    }
}

/* ---- --latency N: one small object read N times, p50 / p99 beside loopback TCP's round trip ----
 */

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* A connected loopback TCP pair (c, a) with Nagle off. 0, or -1 with nothing left open. */
static int loopback_pair(int *c_p, int *a_p)
{
    int l = socket(AF_INET, SOCK_STREAM, 0), a = -1, c = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {0};
    socklen_t sl = sizeof(sa);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int one = 1;
    if (l >= 0 && c >= 0 && bind(l, (struct sockaddr *)&sa, sizeof(sa)) == 0 && listen(l, 1) == 0 &&
        getsockname(l, (struct sockaddr *)&sa, &sl) == 0 &&
        connect(c, (struct sockaddr *)&sa, sizeof(sa)) == 0)
        a = accept(l, NULL, NULL);
    if (l >= 0)
        close(l);
    if (a < 0) {
        if (c >= 0)
            close(c);
        return -1;
    }
    setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    setsockopt(a, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    *c_p = c;
    *a_p = a;
    return 0;
}

/* The echoing end of a two-thread round trip. */
static void echo_thread(void *arg)
{
    int fd = *(int *)arg;
    char x;
    while (read(fd, &x, 1) == 1 && write(fd, &x, 1) == 1)
        ;
}

/* p50 of n one-byte ping-pongs over loopback TCP. threads 1: both ends in this thread (blocking
 * sockets): the kernel's round trip without any wake-up. threads 2: the echoing end on another
 * thread, so each direction wakes a sleeping thread, as every hop between two processes (client,
 * master, node) does. */
static uint64_t tcp_rtt_p50_ns(int n, int threads)
{
    int c, a;
    uint64_t *t = calloc((size_t)n, sizeof(*t)), p50 = 0;
    uv_thread_t th;
    if (t == NULL || loopback_pair(&c, &a) != 0) {
        free(t);
        return 0;
    }
    if (threads == 2 && uv_thread_create(&th, echo_thread, &a) != 0)
        threads = 0;
    char x = 'x';
    int i;
    for (i = 0; threads && i < n; i++) {
        uint64_t t0 = uv_hrtime();
        if (write(c, &x, 1) != 1 ||
            (threads == 1 && (read(a, &x, 1) != 1 || write(a, &x, 1) != 1)) || read(c, &x, 1) != 1)
            break;
        t[i] = uv_hrtime() - t0;
    }
    if (threads == 2) {
        shutdown(c, SHUT_WR); /* the echo thread reads EOF and ends */
        uv_thread_join(&th);
    }
    qsort(t, (size_t)i, sizeof(*t), cmp_u64);
    p50 = i ? t[i / 2] : 0;
    free(t);
    close(a);
    close(c);
    return p50;
}

/* Phases of --latency: gets through the location cache (the object located within its lease),
 * alternating between the client as configured (inline reads on: the bytes over the node's
 * control port) and a second client without inline reads (the engines' offer path), so that
 * both see the same load; then gets that ask the master each time (a client without the cache),
 * then exists alone. */
enum { LAT_CACHED, LAT_ENGINE, LAT_MASTER, LAT_EXISTS, LAT_PHASES };

typedef struct {
    bench_t *b;
    baton_store_client_t *uncached, *engine;
    int n, phase, i, failed;
    int sub; /* LAT_CACHED: 0 the inline get of the pair, 1 the engine's */
    uint64_t *lat[LAT_PHASES], t0;
} lat_t;

static void lat_next(lat_t *L);

static void on_lat_done(void *data, int status, const baton_store_result_t *res, size_t n,
                        size_t prefix)
{
    lat_t *L = data;
    (void)n;
    (void)prefix;
    int p = L->phase == LAT_CACHED && L->sub ? LAT_ENGINE : L->phase;
    if (status != 0 || res[0].status != 0 ||
        (p != LAT_EXISTS &&
         memcmp(baton_xfer_mem_addr(L->b->dst), baton_xfer_mem_addr(L->b->src), L->b->size) != 0))
        L->failed++;
    else
        L->lat[p][L->i] = uv_hrtime() - L->t0;
    memset(baton_xfer_mem_addr(L->b->dst), 0, L->b->size);
    if (L->failed > 10) {
        uv_stop(L->b->loop);
        return;
    }
    if (L->phase == LAT_CACHED)
        L->sub ^= 1;
    if (L->sub == 0 && ++L->i >= L->n) {
        L->i = 0;
        L->phase = L->phase == LAT_CACHED ? LAT_MASTER : L->phase + 1;
        if (L->phase == LAT_PHASES) {
            uv_stop(L->b->loop);
            return;
        }
    }
    lat_next(L);
}

static void lat_next(lat_t *L)
{
    const char *key = L->b->objs[0].key;
    baton_store_client_t *cl = L->phase == LAT_MASTER ? L->uncached : L->sub ? L->engine : L->b->cl;
    L->t0 = uv_hrtime();
    int rc = L->phase == LAT_EXISTS ? baton_store_exists(L->b->cl, &key, 1, on_lat_done, L)
                                    : baton_store_get(cl, L->b->objs, 1, on_lat_done, L);
    if (rc != 0) {
        L->failed = 100;
        uv_stop(L->b->loop);
    }
}

static void on_lat_put(void *data, int status, const baton_store_result_t *res, size_t n,
                       size_t prefix)
{
    lat_t *L = data;
    (void)n;
    (void)prefix;
    if (status != 0 || res[0].status != 0) {
        L->failed = 100;
        uv_stop(L->b->loop);
        return;
    }
    L->b->objs[0].addr = baton_xfer_mem_addr(L->b->dst);
    lat_next(L);
}

void baton__client_inline_stats(const baton_store_client_t *cl, uint64_t *reads,
                                uint64_t *fallbacks);

static double pct_us(const uint64_t *v, int n, int pct)
{
    return (double)v[(size_t)n * (size_t)pct / 100] / 1e3;
}

static int run_latency(bench_t *b, const baton_store_config_t *sc, int n)
{
    lat_t L = {b, NULL, NULL, n, 0, 0, 0, 0, {NULL}, 0};
    baton_store_config_t c2 = *sc, c3 = *sc;
    c2.location_cache = 0;
    c3.inline_max = 0;
    int ok = baton_store_client_create(b->loop, &c2, &L.uncached) == 0 &&
             baton_store_client_create(b->loop, &c3, &L.engine) == 0;
    for (int p = 0; p < LAT_PHASES; p++)
        ok = ok && (L.lat[p] = calloc((size_t)n, sizeof(uint64_t))) != NULL;
    if (!ok)
        return 2;
    snprintf(b->keys_buf[0], sizeof(b->keys_buf[0]), "bench-lat-%d", (int)getpid());
    fill(baton_xfer_mem_addr(b->src), b->size, 1, 0);
    b->objs[0] = (baton_store_obj_t){b->keys_buf[0], baton_xfer_mem_addr(b->src), b->size};
    if (baton_store_put(b->cl, b->objs, 1, NULL, on_lat_put, &L) != 0)
        return 2;
    uv_run(b->loop, UV_RUN_DEFAULT);
    if (L.phase < LAT_PHASES)
        return 2;
    for (int p = 0; p < LAT_PHASES; p++)
        qsort(L.lat[p], (size_t)n, sizeof(uint64_t), cmp_u64);
    uint64_t rtt = tcp_rtt_p50_ns(1000, 1), rtt2 = tcp_rtt_p50_ns(1000, 2);
    uint64_t inl = 0, fell = 0;
    baton__client_inline_stats(b->cl, &inl, &fell);
    double p50 = pct_us(L.lat[LAT_CACHED], n, 50), ep50 = pct_us(L.lat[LAT_ENGINE], n, 50);
    printf("{\"latency\":true,\"size\":%llu,\"gets\":%d,\"failed\":%d,\"inline_max\":%u,"
           "\"get_p50_us\":%.1f,\"get_p99_us\":%.1f,\"get_engine_p50_us\":%.1f,"
           "\"get_engine_p99_us\":%.1f,\"get_via_master_p50_us\":%.1f,"
           "\"get_via_master_p99_us\":%.1f,\"exists_p50_us\":%.1f,\"tcp_rtt_p50_us\":%.1f,"
           "\"tcp_rtt_2threads_p50_us\":%.1f,\"p50_over_rtt\":%.1f,\"engine_p50_over_rtt\":%.1f,"
           "\"inline_reads\":%llu,\"inline_fallbacks\":%llu}\n",
           (unsigned long long)b->size, n, L.failed, sc->inline_max, p50,
           pct_us(L.lat[LAT_CACHED], n, 99), ep50, pct_us(L.lat[LAT_ENGINE], n, 99),
           pct_us(L.lat[LAT_MASTER], n, 50), pct_us(L.lat[LAT_MASTER], n, 99),
           pct_us(L.lat[LAT_EXISTS], n, 50), (double)rtt / 1e3, (double)rtt2 / 1e3,
           rtt ? p50 * 1e3 / (double)rtt : 0.0, rtt ? ep50 * 1e3 / (double)rtt : 0.0,
           (unsigned long long)inl, (unsigned long long)fell);
    fflush(stdout);
    for (int p = 0; p < LAT_PHASES; p++)
        free(L.lat[p]);
    return L.failed ? 1 : 0;
}

/* ---- --exists N: N objects of --size put in batches of --batch, then batches of exists over
 * them for --duration-s through a client that locates (the API's default) and one that does not.
 * ---- */

typedef struct {
    bench_t *b;
    baton_store_client_t *plain; /* location_cache 0: a plain exists */
    uint64_t n, next, done;
    const char **keys;
    int phase; /* 0 put, 1 exists (locating), 2 exists (plain) */
    uint64_t t0, deadline_ms;
    double put_s, keys_per_s[2];
    int failed;
} ex_t;

static void ex_next(ex_t *E);

static void ex_keys(ex_t *E, uint64_t first, uint32_t count)
{
    for (uint32_t j = 0; j < count; j++) {
        snprintf(E->b->keys_buf[j], sizeof(E->b->keys_buf[j]), "ex-%d-%llu", (int)getpid(),
                 (unsigned long long)(first + j));
        E->keys[j] = E->b->keys_buf[j];
    }
}

static void on_ex_done(void *data, int status, const baton_store_result_t *res, size_t n,
                       size_t prefix)
{
    ex_t *E = data;
    (void)prefix;
    for (size_t i = 0; i < n; i++)
        if (status != 0 || res[i].status != 0)
            E->failed++;
    E->done += n;
    if (E->failed) {
        uv_stop(E->b->loop);
        return;
    }
    uint64_t now = uv_hrtime();
    if (E->phase == 0 && E->done >= E->n) {
        E->put_s = (double)(now - E->t0) / 1e9;
    } else if (E->phase > 0 && baton_now_ms() >= E->deadline_ms) {
        E->keys_per_s[E->phase - 1] = (double)E->done / ((double)(now - E->t0) / 1e9);
    } else {
        ex_next(E);
        return;
    }
    if (++E->phase == 3) {
        uv_stop(E->b->loop);
        return;
    }
    E->done = E->next = 0;
    E->t0 = uv_hrtime();
    E->deadline_ms = baton_now_ms() + (uint64_t)(E->b->duration_s ? E->b->duration_s : 3) * 1000;
    ex_next(E);
}

static void ex_next(ex_t *E)
{
    bench_t *b = E->b;
    uint64_t first = E->next % E->n;
    uint32_t count = (uint32_t)(E->n - first < b->batch ? E->n - first : b->batch);
    E->next += count;
    ex_keys(E, first, count);
    int rc;
    if (E->phase == 0) {
        for (uint32_t j = 0; j < count; j++)
            b->objs[j] = (baton_store_obj_t){
                E->keys[j], (uint8_t *)baton_xfer_mem_addr(b->src) + j * b->size, b->size};
        rc = baton_store_put(b->cl, b->objs, count, NULL, on_ex_done, E);
    } else {
        rc = baton_store_exists(E->phase == 1 ? b->cl : E->plain, E->keys, count, on_ex_done, E);
    }
    if (rc != 0) {
        E->failed++;
        uv_stop(b->loop);
    }
}

static int run_exists(bench_t *b, const baton_store_config_t *sc, uint64_t n)
{
    ex_t E = {b, NULL, n, 0, 0, calloc(b->batch, sizeof(char *)), 0, 0, 0, 0, {0, 0}, 0};
    baton_store_config_t c2 = *sc;
    c2.location_cache = 0;
    if (E.keys == NULL || baton_store_client_create(b->loop, &c2, &E.plain) != 0)
        return 2;
    fill(baton_xfer_mem_addr(b->src), b->size * b->batch, 7, 0);
    E.t0 = uv_hrtime();
    ex_next(&E);
    uv_run(b->loop, UV_RUN_DEFAULT);
    printf("{\"exists\":true,\"objects\":%llu,\"size\":%llu,\"batch\":%u,\"failed\":%d,"
           "\"puts_per_s\":%.0f,\"exists_locating_keys_per_s\":%.0f,"
           "\"exists_plain_keys_per_s\":%.0f}\n",
           (unsigned long long)n, (unsigned long long)b->size, b->batch, E.failed,
           E.put_s > 0 ? (double)n / E.put_s : 0.0, E.keys_per_s[0], E.keys_per_s[1]);
    fflush(stdout);
    free(E.keys);
    return E.failed || E.phase < 3 ? 1 : 0;
}

static double memcpy_gbps(uint64_t len)
{
    uint8_t *a = malloc(len), *c = malloc(len);
    if (a == NULL || c == NULL) {
        free(a);
        free(c);
        return 0;
    }
    memset(a, 1, len);
    memset(c, 2, len);
    uint64_t t0 = uv_hrtime();
    int reps = 0;
    while (uv_hrtime() - t0 < 200000000ull || reps < 2) {
        memcpy(c, a, len);
        reps++;
    }
    double s = (double)(uv_hrtime() - t0) / 1e9;
    double g = (double)len * reps / s / 1e9 + (c[len / 2] == 9 ? 1e-9 : 0);
    free(a);
    free(c);
    return g;
}

static void on_room(baton_xfer_engine_t *e, baton_xfer_room_t *room, void *data)
{
    (void)e;
    (void)data;
    baton_xfer_room_abort(room, BATON_XFER_ENOTSUP);
}

static void on_room_closed(baton_xfer_engine_t *e, baton_xfer_room_t *room, int st, void *data)
{
    (void)e;
    (void)room;
    (void)st;
    (void)data;
}

static int parse_size(const char *s, uint64_t *v)
{
    char *end;
    unsigned long long x = strtoull(s, &end, 10);
    uint64_t mul = 1;
    if (*end == 'K' || *end == 'k')
        mul = 1024, end++;
    else if (*end == 'M' || *end == 'm')
        mul = 1024 * 1024, end++;
    if (end == s || *end != '\0' || x == 0 || *s == '-')
        return -1;
    *v = x * mul;
    return 0;
}

int baton__bench_main(int argc, char **argv);
int baton__bench_meta_scale(uint64_t n);
int baton__bench_own_progress(const char *master, const uint8_t *secret, size_t secret_len,
                              uint64_t size, uint32_t batch, int lat_n);

int baton__bench_main(int argc, char **argv)
{
    static const struct option lo[] = {
        {"master", required_argument, NULL, 'm'},
        {"kv-secret-file", required_argument, NULL, 'k'},
        {"host", required_argument, NULL, 'H'},
        {"size", required_argument, NULL, 's'},
        {"batch", required_argument, NULL, 'b'},
        {"rounds", required_argument, NULL, 'r'},
        {"replicas", required_argument, NULL, 'R'},
        {"duration-s", required_argument, NULL, 'd'},
        {"namespace", required_argument, NULL, 'n'},
        {"interval-ms", required_argument, NULL, 'i'},
        {"latency", required_argument, NULL, 'L'},
        {"transport", required_argument, NULL, 't'},
        {"reads", required_argument, NULL, 'G'},
        {"exists", required_argument, NULL, 'E'},
        {"meta-objects", required_argument, NULL, 'M'},
        {"own-progress", no_argument, NULL, 'O'},
        {"inline-max", required_argument, NULL, 'I'},
        {"read-interval-ms", required_argument, NULL, 'T'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    bench_t b;
    int latency_n = 0;
    uint64_t exists_n = 0;
    int own_progress = 0;
    uint64_t inline_max = BATON__SP_INLINE_DEFAULT;
    memset(&b, 0, sizeof(b));
    b.size = 1 << 20;
    b.batch = 128;
    b.rounds = 3;
    b.replicas = 1;
    b.reads = 1;
    int o;
    optind = 1;
    while ((o = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (o) {
        case 'm':
            b.master = optarg;
            break;
        case 'k':
            b.secret_file = optarg;
            break;
        case 'H':
            b.host = optarg;
            break;
        case 's':
            if (parse_size(optarg, &b.size) != 0)
                return 2;
            break;
        case 'b':
            b.batch = (uint32_t)atoi(optarg);
            break;
        case 'r':
            b.rounds = (uint32_t)atoi(optarg);
            break;
        case 'R':
            b.replicas = (uint32_t)atoi(optarg);
            break;
        case 'd':
            b.duration_s = (uint32_t)atoi(optarg);
            break;
        case 'n':
            b.ns = optarg;
            break;
        case 'i':
            b.interval_ms = (uint32_t)atoi(optarg);
            break;
        case 'G':
            b.reads = (uint32_t)atoi(optarg);
            break;
        case 'T':
            b.read_interval_ms = (uint32_t)atoi(optarg);
            break;
        case 'E':
            exists_n = strtoull(optarg, NULL, 10);
            if (exists_n == 0)
                return 2;
            break;
        case 'M':
            return baton__bench_meta_scale(strtoull(optarg, NULL, 10));
        case 'O':
            own_progress = 1;
            break;
        case 'I':
            if ((strcmp(optarg, "0") != 0 && parse_size(optarg, &inline_max) != 0) ||
                inline_max > BATON__SP_INLINE_MAX)
                return 2;
            if (strcmp(optarg, "0") == 0)
                inline_max = 0;
            break;
        case 't':
            if (baton_xfer_transport_parse(optarg, &b.transport) != 0)
                return 2;
            break;
        case 'L':
            latency_n = atoi(optarg);
            if (latency_n <= 0)
                return 2;
            break;
        case 'h':
            printf("usage: baton-store bench --master H:P [--size N[K|M]] [--batch N] "
                   "[--rounds N | --duration-s S] [--replicas N] [--kv-secret-file F] "
                   "[--host H] [--namespace NS] [--interval-ms N] [--latency N] "
                   "[--transport tcp|shm|rdma] [--reads N] [--exists N] [--meta-objects N] "
                   "[--own-progress] [--inline-max N[K]] [--read-interval-ms N]\n"
                   "--reads N: gets of each round's batch (default 1; later ones find the "
                   "objects through the location cache), --read-interval-ms N apart (0)\n"
                   "--exists N: N objects of --size put in batches, then exists over them for "
                   "--duration-s (3) locating and plain: keys/s\n"
                   "--meta-objects N: the master's object table in this process with N objects "
                   "(no master needed): heap per object, exists/s on one core\n"
                   "--own-progress: one batch put, read back, checked, from a client and an "
                   "engine without a loop (own-progress mode); with --latency N, N gets of one "
                   "4 KiB object from the calling thread\n"
                   "--latency N: one object of --size read N times through the location cache "
                   "inline and N times through the engines (alternating), N times asking the "
                   "master, and N exists: p50 / p99 beside loopback TCP's round trip (one "
                   "thread, and two threads)\n"
                   "--inline-max N: the client's inline-read threshold (default 64K; 0: off)\n"
                   "round lines report cumulative counts and GB/s (with --duration-s at most "
                   "two a second, and every failed round)\n");
            return 0;
        default:
            return 2;
        }
    }
    if (b.master == NULL || b.batch == 0 || b.batch > BATON_STORE_BATCH_MAX || b.rounds == 0 ||
        b.reads == 0 || b.replicas == 0 || b.replicas > BATON_STORE_REPLICAS_MAX) {
        fprintf(stderr, "baton-store bench: --master H:P is required; batch 1..%d\n",
                BATON_STORE_BATCH_MAX);
        return 2;
    }
    if (b.secret_file &&
        baton__store_read_secret(b.secret_file, b.secret, sizeof(b.secret), &b.secret_len) != 0)
        return 2;
    if (own_progress)
        return baton__bench_own_progress(b.master, b.secret, b.secret_len, b.size, b.batch,
                                         latency_n);
    b.loop = uv_default_loop();
    baton_xfer_config_t xc;
    baton_xfer_config_init(&xc);
    xc.listen_host = b.host ? b.host : "127.0.0.1";
    xc.log_level = BATON_XFER_LOG_WARN;
    if (b.transport && b.transport != BATON_XFER_TRANSPORT_TCP) {
        xc.transports[0] = b.transport;
        xc.transports[1] = BATON_XFER_TRANSPORT_TCP;
        xc.n_transports = 2;
    }
    if (b.secret_len) {
        xc.secret = b.secret;
        xc.secret_len = b.secret_len;
    }
    baton_xfer_callbacks_t cbs = {on_room, on_room_closed, NULL, &b};
    int rc = baton_xfer_engine_create(b.loop, &xc, &cbs, &b.eng);
    if (rc == 0)
        rc = baton_xfer_mem_alloc(b.eng, (size_t)b.size * b.batch, &b.src);
    if (rc == 0)
        rc = baton_xfer_mem_alloc(b.eng, (size_t)b.size * b.batch, &b.dst);
    baton_store_config_t sc;
    baton_store_config_init(&sc);
    sc.master = b.master;
    sc.engine = b.eng;
    sc.host = b.host;
    sc.ns = b.ns;
    sc.secret = b.secret_len ? b.secret : NULL;
    sc.secret_len = b.secret_len;
    sc.request_timeout_ms = 2000;
    sc.inline_max = (uint32_t)inline_max;
    if (rc == 0)
        rc = baton_store_client_create(b.loop, &sc, &b.cl);
    b.objs = calloc(b.batch, sizeof(*b.objs));
    b.keys_buf = calloc(b.batch, sizeof(*b.keys_buf));
    if (rc != 0 || b.objs == NULL || b.keys_buf == NULL) {
        fprintf(stderr, "baton-store bench: %s\n", baton_store_strerror(rc ? rc : -12));
        return 2;
    }
    if (latency_n) {
        fflush(stdout);
        _exit(run_latency(&b, &sc, latency_n));
    }
    if (exists_n) {
        fflush(stdout);
        _exit(run_exists(&b, &sc, exists_n));
    }
    printf("{\"memcpy_GBps\":%.3f,\"size\":%llu,\"batch\":%u,\"replicas\":%u}\n",
           memcpy_gbps(b.size * b.batch), (unsigned long long)b.size, b.batch, b.replicas);
    uv_timer_init(b.loop, &b.pause);
    b.pause.data = &b;
    b.deadline_ms = baton_now_ms() + (uint64_t)b.duration_s * 1000;
    next_round(&b);
    uv_run(b.loop, UV_RUN_DEFAULT);
    uint64_t inl = 0, fell = 0;
    baton__client_inline_stats(b.cl, &inl, &fell);
    printf("{\"summary\":true,\"put_ok\":%llu,\"put_failed\":%llu,\"get_ok\":%llu,"
           "\"get_failed\":%llu,\"missing\":%llu,\"corrupted\":%llu,\"inline_reads\":%llu,"
           "\"inline_fallbacks\":%llu}\n",
           (unsigned long long)b.put_ok, (unsigned long long)b.put_failed,
           (unsigned long long)b.get_ok, (unsigned long long)b.get_failed,
           (unsigned long long)b.missing, (unsigned long long)b.corrupted, (unsigned long long)inl,
           (unsigned long long)fell);
    fflush(stdout);
    /* The process ends here: the engine's threads and regions go with it. */
    int bad = b.corrupted != 0 || (!b.duration_s && (b.put_failed || b.get_failed));
    _exit(bad ? 1 : 0);
}
