/* store/bench_own.c — `baton-store bench --own-progress`: the client API without a caller loop
 * (an engine and a client created with loop NULL): put, get (every byte compared), exists, remove
 * (answered, the objects being leased) from this thread and exists from a second one, every
 * callback run by polling the client's fd and calling baton_store_client_dispatch; with
 * --latency N, N gets of one 4 KiB object from this thread (located: read inline on it), timed
 * from the call to its callback; then the client's and the engine's orderly close. */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "baton/store.h"

int baton__bench_own_progress(const char *master, const uint8_t *secret, size_t secret_len,
                              uint64_t size, uint32_t batch, int lat_n);
void baton__client_inline_stats(const baton_store_client_t *cl, uint64_t *reads,
                                uint64_t *fallbacks);

#define SMALL 4096

typedef struct {
    int done, status, ok;
    size_t prefix;
    int closed, eng_closed;
    int thread_ok;
    baton_store_client_t *cl;
    const char *const *keys;
    uint32_t n;
} own_t;

static void on_batch(void *data, int status, const baton_store_result_t *res, size_t n,
                     size_t prefix)
{
    own_t *o = data;
    o->status = status;
    o->ok = 0;
    for (size_t i = 0; i < n; i++)
        o->ok += status == 0 && res[i].status == 0;
    o->prefix = prefix;
    o->done++;
}

static void on_thread_exists(void *data, int status, const baton_store_result_t *res, size_t n,
                             size_t prefix)
{
    own_t *o = data;
    (void)res;
    o->thread_ok = status == 0 && prefix == n;
}

static void on_closed(baton_store_client_t *cl, void *data)
{
    (void)cl;
    ((own_t *)data)->closed = 1;
}

/* The engine listens (nodes pull the puts' bytes from it) but serves no offers of its own. */
static void on_room(baton_xfer_engine_t *eng, baton_xfer_room_t *room, void *data)
{
    (void)eng;
    (void)data;
    baton_xfer_room_abort(room, BATON_XFER_ENOTSUP);
}

static void on_room_closed(baton_xfer_engine_t *eng, baton_xfer_room_t *room, int st, void *data)
{
    (void)eng;
    (void)room;
    (void)st;
    (void)data;
}

static void on_eng_closed(baton_xfer_engine_t *eng, void *data)
{
    (void)eng;
    ((own_t *)data)->eng_closed = 1;
}

/* Polls the client's fd and dispatches until *flag is set (30 s at most). */
static int wait_client(baton_store_client_t *cl, int fd, const int *flag)
{
    for (int i = 0; i < 3000 && !*flag; i++) {
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, 10) < 0 || baton_store_client_dispatch(cl) < 0)
            return -1;
    }
    return *flag ? 0 : -1;
}

/* The second thread: one call from elsewhere (its callback still runs in this thread's
 * dispatch). */
static void other_thread(void *arg)
{
    own_t *o = arg;
    if (baton_store_exists(o->cl, o->keys, o->n, on_thread_exists, o) != 0)
        o->thread_ok = -1;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* n gets of one small object (put, then located by the first get), each timed from the call to
 * its callback's dispatch; bytes compared. How many came back right; p50 / p99 in *p50, *p99. */
static int small_gets(own_t *o, int fd, uint8_t *s, uint8_t *d, int n, double *p50, double *p99)
{
    char key[48];
    snprintf(key, sizeof(key), "own-small-%d", (int)getpid());
    baton_store_obj_t obj = {key, s, SMALL};
    uint64_t *t = calloc((size_t)n + 1, sizeof(*t));
    int ok = 0;
    o->done = 0;
    if (t == NULL || baton_store_put(o->cl, &obj, 1, NULL, on_batch, o) != 0 ||
        wait_client(o->cl, fd, &o->done) != 0 || o->ok != 1) {
        free(t);
        return -1;
    }
    obj.addr = d;
    for (int i = 0; i <= n; i++) { /* the first locates it */
        memset(d, 0, SMALL);
        o->done = 0;
        uint64_t t0 = uv_hrtime();
        if (baton_store_get(o->cl, &obj, 1, on_batch, o) != 0 ||
            wait_client(o->cl, fd, &o->done) != 0)
            break;
        t[i] = uv_hrtime() - t0;
        ok += i > 0 && o->ok == 1 && memcmp(s, d, SMALL) == 0;
    }
    qsort(t + 1, (size_t)n, sizeof(*t), cmp_u64);
    *p50 = (double)t[1 + n / 2] / 1e3;
    *p99 = (double)t[1 + (size_t)n * 99 / 100] / 1e3;
    free(t);
    return ok;
}

int baton__bench_own_progress(const char *master, const uint8_t *secret, size_t secret_len,
                              uint64_t size, uint32_t batch, int lat_n)
{
    baton_xfer_config_t xc;
    baton_xfer_config_init(&xc);
    xc.listen_host = "127.0.0.1";
    xc.log_level = BATON_XFER_LOG_WARN;
    if (secret_len) {
        xc.secret = secret;
        xc.secret_len = secret_len;
    }
    baton_xfer_callbacks_t cbs = {on_room, on_room_closed, NULL, NULL};
    baton_xfer_engine_t *eng;
    baton_xfer_mem_t *src, *dst;
    own_t o;
    memset(&o, 0, sizeof(o));
    char(*kb)[48] = calloc(batch, sizeof(*kb));
    const char **keys = calloc(batch, sizeof(*keys));
    baton_store_obj_t *objs = calloc(batch, sizeof(*objs));
    if (kb == NULL || keys == NULL || objs == NULL ||
        baton_xfer_engine_create(NULL, &xc, &cbs, &eng) != 0 ||
        baton_xfer_mem_alloc(eng, size * batch, &src) != 0 ||
        baton_xfer_mem_alloc(eng, size * batch, &dst) != 0)
        return 2;
    baton_store_config_t sc;
    baton_store_config_init(&sc);
    sc.master = master;
    sc.engine = eng;
    sc.secret = secret_len ? secret : NULL;
    sc.secret_len = secret_len;
    if (baton_store_client_create(NULL, &sc, &o.cl) != 0)
        return 2;
    int fd = baton_store_client_fd(o.cl);
    uint8_t *s = baton_xfer_mem_addr(src), *d = baton_xfer_mem_addr(dst);
    for (uint64_t i = 0; i < size * batch; i++)
        s[i] = (uint8_t)(i * 131u ^ (i >> 11) ^ (uint64_t)getpid());
    for (uint32_t i = 0; i < batch; i++) {
        snprintf(kb[i], sizeof(kb[i]), "own-%d-%u", (int)getpid(), i);
        keys[i] = kb[i];
        objs[i] = (baton_store_obj_t){kb[i], s + i * size, size};
    }
    int put_ok = -1, get_ok = -1, exists_prefix = -1, removed = -1, corrupted = 0;
    if (baton_store_put(o.cl, objs, batch, NULL, on_batch, &o) == 0 &&
        wait_client(o.cl, fd, &o.done) == 0)
        put_ok = o.ok;
    for (uint32_t i = 0; i < batch; i++)
        objs[i].addr = d + i * size;
    o.done = 0;
    if (baton_store_get(o.cl, objs, batch, on_batch, &o) == 0 &&
        wait_client(o.cl, fd, &o.done) == 0)
        get_ok = o.ok;
    corrupted = memcmp(s, d, size * batch) != 0;
    int small_ok = 0;
    double p50 = 0, p99 = 0;
    if (lat_n > 0 && size >= SMALL)
        small_ok = small_gets(&o, fd, s, d, lat_n, &p50, &p99);
    /* a call from another thread, while this one dispatches */
    o.keys = keys;
    o.n = batch;
    uv_thread_t th;
    if (uv_thread_create(&th, other_thread, &o) == 0) {
        uv_thread_join(&th);
        wait_client(o.cl, fd, &o.thread_ok);
    }
    o.done = 0;
    if (baton_store_exists(o.cl, keys, batch, on_batch, &o) == 0 &&
        wait_client(o.cl, fd, &o.done) == 0)
        exists_prefix = (int)o.prefix;
    o.done = 0; /* the objects are leased (read just now): every key answers "busy" */
    if (baton_store_remove(o.cl, keys, batch, on_batch, &o) == 0 &&
        wait_client(o.cl, fd, &o.done) == 0 && o.status == 0)
        removed = o.ok;
    uint64_t inl = 0, fell = 0;
    baton__client_inline_stats(o.cl, &inl, &fell);
    baton_store_client_destroy(o.cl, on_closed, &o);
    int closed = wait_client(o.cl, fd, &o.closed) == 0;
    /* the client no longer dispatches the engine: this thread does, until it has closed */
    baton_xfer_mem_deregister(eng, src);
    baton_xfer_mem_deregister(eng, dst);
    baton_xfer_engine_destroy(eng, on_eng_closed, &o);
    for (int i = 0; i < 3000 && !o.eng_closed; i++) {
        struct pollfd p = {baton_xfer_engine_fd(eng), POLLIN, 0};
        poll(&p, 1, 10);
        baton_xfer_engine_dispatch(eng);
    }
    printf("{\"own_progress\":true,\"objects\":%u,\"put_ok\":%d,\"get_ok\":%d,\"corrupted\":%d,"
           "\"other_thread_exists\":%d,\"exists_prefix\":%d,\"removed\":%d,\"closed\":%d,"
           "\"engine_closed\":%d,\"small_gets\":%d,\"small_gets_ok\":%d,"
           "\"small_get_p50_us\":%.1f,\"small_get_p99_us\":%.1f,\"inline_reads\":%llu,"
           "\"inline_fallbacks\":%llu}\n",
           batch, put_ok, get_ok, corrupted, o.thread_ok, exists_prefix, removed, closed,
           o.eng_closed, lat_n, small_ok, p50, p99, (unsigned long long)inl,
           (unsigned long long)fell);
    fflush(stdout);
    free(kb);
    free(keys);
    free(objs);
    int good = put_ok == (int)batch && get_ok == (int)batch && !corrupted && o.thread_ok == 1 &&
               exists_prefix == (int)batch && removed == 0 && closed && o.eng_closed &&
               small_ok == (lat_n > 0 && size >= SMALL ? lat_n : 0);
    return good ? 0 : 1;
}
