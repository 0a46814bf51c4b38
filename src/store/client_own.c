/* store/client_own.c — the store client's own-progress mode (no caller loop): the client runs its
 * own loop on its own thread, which also dispatches the engine; calls from any thread are posted
 * to it, and completions come back through an eventfd the host polls and
 * baton_store_client_dispatch, which runs their callbacks on the host's thread. */
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "store/client_int.h"

/* A call posted from the host, or a completion going back to it (one record, two lists). */
typedef struct ocall_s {
    struct ocall_s *next;
    struct baton__own_s *cl_own;
    int type; /* BATON__SP_PUT_START, _GET, _EXISTS, _REMOVE; 0: destroy */
    size_t n;
    baton_store_obj_t *objs; /* put / get: the caller's buffers, our copies of the keys */
    char **keys;             /* exists / remove (and the keys of objs) */
    baton_store_put_opts_t opts;
    baton_store_block_t *blocks; /* put: our copy of opts.blocks (token ids after them) */
    baton_store_batch_cb cb;
    void *data;
    /* the completion */
    int status;
    size_t prefix;
    baton_store_result_t *res;
} ocall_t;

struct baton__own_s {
    baton_store_client_t *cl;
    uv_loop_t loop;
    uv_thread_t thread;
    uv_async_t wake;    /* calls were posted */
    uv_poll_t eng_poll; /* the engine's fd: this thread dispatches the engine */
    uv_mutex_t lock;
    ocall_t *calls, **calls_tail;
    ocall_t *dones, **dones_tail;
    int evfd;
    int destroying; /* destroy was called (host side, under lock) */
    int closed;     /* the thread ended: the close callback is next (host side, under lock) */
    baton_store_close_cb close_cb;
    void *close_data;
};

static void ocall_free(ocall_t *c)
{
    for (size_t i = 0; c->keys && i < c->n; i++)
        free(c->keys[i]);
    free(c->keys);
    free(c->objs);
    free(c->blocks);
    free(c->res);
    free(c);
}

/* The blocks of a put, copied with their token ids into one allocation: the caller's may be
 * gone when the client's thread runs the put. */
static int copy_blocks(ocall_t *c)
{
    if (c->opts.blocks == NULL)
        return 0;
    size_t ids = 0;
    for (size_t i = 0; i < c->n; i++)
        ids += c->opts.blocks[i].n_tokens;
    c->blocks = malloc(c->n * sizeof(*c->blocks) + ids * sizeof(uint32_t));
    if (c->blocks == NULL)
        return BATON_XFER_ENOMEM;
    uint32_t *tok = (uint32_t *)(c->blocks + c->n);
    for (size_t i = 0; i < c->n; i++) {
        c->blocks[i] = c->opts.blocks[i];
        if (c->blocks[i].n_tokens && c->blocks[i].token_ids) {
            memcpy(tok, c->blocks[i].token_ids, c->blocks[i].n_tokens * sizeof(*tok));
            c->blocks[i].token_ids = tok;
            tok += c->blocks[i].n_tokens;
        }
    }
    c->opts.blocks = c->blocks;
    return 0;
}

static void signal_host(baton__own_t *o)
{
    uint64_t one = 1;
    ssize_t w = write(o->evfd, &one, sizeof(one)); /* EAGAIN: already readable */
    (void)w;
}

static void push_done(baton__own_t *o, ocall_t *c)
{
    uv_mutex_lock(&o->lock);
    c->next = NULL;
    *o->dones_tail = c;
    o->dones_tail = &c->next;
    uv_mutex_unlock(&o->lock);
    signal_host(o);
}

/* The client thread's callback of a posted call: the outcome goes to the host. */
static void on_done(void *data, int status, const baton_store_result_t *res, size_t n,
                    size_t prefix)
{
    ocall_t *c = data;
    c->status = status;
    c->prefix = prefix;
    c->res = malloc(n * sizeof(*res));
    if (c->res)
        memcpy(c->res, res, n * sizeof(*res));
    else
        c->status = BATON_XFER_ENOMEM;
    push_done(c->cl_own, c);
}

static void run_call(baton__own_t *o, ocall_t *c)
{
    baton_store_client_t *cl = o->cl;
    int rc;
    switch (c->type) {
    case BATON__SP_PUT_START:
        rc = baton_store_put(cl, c->objs, c->n, &c->opts, on_done, c);
        break;
    case BATON__SP_GET:
        rc = baton_store_get(cl, c->objs, c->n, on_done, c);
        break;
    case BATON__SP_EXISTS:
        rc = baton_store_exists(cl, (const char *const *)c->keys, c->n, on_done, c);
        break;
    default:
        rc = baton_store_remove(cl, (const char *const *)c->keys, c->n, on_done, c);
        break;
    }
    if (rc != 0) { /* the host's call returned 0: its callback still fires, with the error */
        c->status = rc;
        c->res = calloc(c->n, sizeof(*c->res));
        for (size_t i = 0; c->res && i < c->n; i++)
            c->res[i].status = rc;
        push_done(o, c);
    }
}

static void on_thread_closed(baton_store_client_t *cl, void *data);

static void on_wake(uv_async_t *h)
{
    baton__own_t *o = h->data;
    uv_mutex_lock(&o->lock);
    ocall_t *list = o->calls;
    o->calls = NULL;
    o->calls_tail = &o->calls;
    uv_mutex_unlock(&o->lock);
    while (list) {
        ocall_t *c = list;
        list = c->next;
        if (c->type == 0) { /* destroy: every call posted before it has run */
            free(c);
            baton_store_client_destroy(o->cl, on_thread_closed, o);
            continue;
        }
        run_call(o, c);
    }
}

static void on_engine(uv_poll_t *h, int status, int events)
{
    baton__own_t *o = h->data;
    (void)status;
    (void)events;
    baton_xfer_engine_dispatch(o->cl->eng);
}

static void on_handle_closed(uv_handle_t *h)
{
    (void)h;
}

/* The client is done on its thread (every operation ended): its handles close, the loop ends. */
static void on_thread_closed(baton_store_client_t *cl, void *data)
{
    baton__own_t *o = data;
    (void)cl;
    uv_poll_stop(&o->eng_poll);
    uv_close((uv_handle_t *)&o->eng_poll, on_handle_closed);
    uv_close((uv_handle_t *)&o->wake, on_handle_closed);
}

static void thread_main(void *arg)
{
    baton__own_t *o = arg;
    uv_run(&o->loop, UV_RUN_DEFAULT);
    uv_loop_close(&o->loop);
    uv_mutex_lock(&o->lock);
    o->closed = 1;
    uv_mutex_unlock(&o->lock);
    signal_host(o);
}

int baton__own_start(baton_store_client_t *cl, uv_loop_t **loop_p)
{
    int efd = baton_xfer_engine_fd(cl->eng);
    if (efd < 0)
        return BATON_XFER_EINVAL; /* a loop-mode engine needs a loop-mode client */
    baton__own_t *o = calloc(1, sizeof(*o));
    if (o == NULL)
        return BATON_XFER_ENOMEM;
    o->cl = cl;
    o->calls_tail = &o->calls;
    o->dones_tail = &o->dones;
    o->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (o->evfd < 0 || uv_loop_init(&o->loop) != 0) {
        if (o->evfd >= 0)
            close(o->evfd);
        free(o);
        return BATON_XFER_ENOMEM;
    }
    uv_mutex_init(&o->lock);
    uv_async_init(&o->loop, &o->wake, on_wake);
    o->wake.data = o;
    uv_poll_init(&o->loop, &o->eng_poll, efd);
    o->eng_poll.data = o;
    uv_poll_start(&o->eng_poll, UV_READABLE, on_engine);
    cl->own = o;
    *loop_p = &o->loop;
    return 0;
}

int baton__own_run(baton_store_client_t *cl)
{
    return uv_thread_create(&cl->own->thread, thread_main, cl->own) == 0 ? 0 : BATON_XFER_ENOMEM;
}

void baton__own_abort(baton_store_client_t *cl)
{
    baton__own_t *o = cl->own;
    uv_close((uv_handle_t *)&o->eng_poll, on_handle_closed);
    uv_close((uv_handle_t *)&o->wake, on_handle_closed);
    uv_run(&o->loop, UV_RUN_DEFAULT);
    uv_loop_close(&o->loop);
    uv_mutex_destroy(&o->lock);
    close(o->evfd);
    free(o);
    cl->own = NULL;
}

int baton__own_here(const baton_store_client_t *cl)
{
    uv_thread_t self = uv_thread_self();
    return uv_thread_equal(&self, &cl->own->thread);
}

int baton__own_complete(baton_store_client_t *cl, const baton_store_result_t *res, size_t n,
                        size_t prefix, baton_store_batch_cb cb, void *data)
{
    baton__own_t *o = cl->own;
    ocall_t *c = calloc(1, sizeof(*c));
    if (c == NULL || (c->res = malloc(n * sizeof(*res))) == NULL) {
        free(c);
        return BATON_XFER_ENOMEM;
    }
    memcpy(c->res, res, n * sizeof(*res));
    c->cl_own = o;
    c->type = BATON__SP_GET;
    c->n = n;
    c->prefix = prefix;
    c->cb = cb;
    c->data = data;
    uv_mutex_lock(&o->lock);
    int rc = o->destroying ? BATON_XFER_ESHUTDOWN : 0;
    if (rc == 0) {
        c->next = NULL;
        *o->dones_tail = c;
        o->dones_tail = &c->next;
    }
    uv_mutex_unlock(&o->lock);
    if (rc != 0)
        ocall_free(c);
    else
        signal_host(o);
    return rc;
}

static int post(baton__own_t *o, ocall_t *c)
{
    uv_mutex_lock(&o->lock);
    int rc = o->destroying ? BATON_XFER_ESHUTDOWN : 0;
    if (rc == 0) {
        c->next = NULL;
        *o->calls_tail = c;
        o->calls_tail = &c->next;
        if (c->type == 0)
            o->destroying = 1;
    }
    uv_mutex_unlock(&o->lock);
    if (rc == 0)
        uv_async_send(&o->wake);
    return rc;
}

int baton__own_post(baton_store_client_t *cl, int type, const baton_store_obj_t *objs,
                    const char *const *keys, size_t n, const baton_store_put_opts_t *opts,
                    baton_store_batch_cb cb, void *data)
{
    ocall_t *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return BATON_XFER_ENOMEM;
    c->cl_own = cl->own;
    c->type = type;
    c->n = n;
    c->cb = cb;
    c->data = data;
    baton_store_put_opts_init(&c->opts);
    if (opts)
        memcpy(&c->opts, opts, opts->size < sizeof(c->opts) ? opts->size : sizeof(c->opts));
    c->opts.size = sizeof(c->opts);
    c->keys = calloc(n, sizeof(*c->keys));
    if (objs)
        c->objs = malloc(n * sizeof(*c->objs));
    int rc = c->keys && (objs == NULL || c->objs) ? 0 : BATON_XFER_ENOMEM;
    if (rc == 0)
        rc = copy_blocks(c);
    for (size_t i = 0; rc == 0 && i < n; i++) {
        const char *k = objs ? objs[i].key : keys[i];
        if ((c->keys[i] = strdup(k ? k : "")) == NULL)
            rc = BATON_XFER_ENOMEM;
        else if (objs)
            c->objs[i] = (baton_store_obj_t){c->keys[i], objs[i].addr, objs[i].len};
    }
    if (rc == 0)
        rc = post(cl->own, c);
    if (rc != 0)
        ocall_free(c);
    return rc;
}

int baton__own_destroy(baton_store_client_t *cl, baton_store_close_cb close_cb, void *data)
{
    ocall_t *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return BATON_XFER_ENOMEM;
    uv_mutex_lock(&cl->own->lock);
    cl->own->close_cb = close_cb;
    cl->own->close_data = data;
    uv_mutex_unlock(&cl->own->lock);
    c->type = 0;
    int rc = post(cl->own, c);
    if (rc != 0)
        free(c);
    return rc;
}

int baton_store_client_fd(const baton_store_client_t *cl)
{
    return cl->own ? cl->own->evfd : -1;
}

int baton_store_client_dispatch(baton_store_client_t *cl)
{
    baton__own_t *o = cl->own;
    if (o == NULL)
        return BATON_XFER_EINVAL;
    uint64_t v;
    ssize_t r = read(o->evfd, &v, sizeof(v)); /* EAGAIN: a spurious wake-up */
    (void)r;
    uv_mutex_lock(&o->lock);
    ocall_t *list = o->dones;
    o->dones = NULL;
    o->dones_tail = &o->dones;
    int closed = o->closed;
    uv_mutex_unlock(&o->lock);
    int ran = 0;
    while (list) {
        ocall_t *c = list;
        list = c->next;
        c->cb(c->data, c->status, c->res, c->n, c->prefix);
        ocall_free(c);
        ran++;
    }
    if (!closed)
        return ran;
    /* The thread has ended (after every completion above was queued): the client goes. */
    uv_thread_join(&o->thread);
    baton_store_close_cb close_cb = o->close_cb;
    void *close_data = o->close_data;
    uv_mutex_destroy(&o->lock);
    close(o->evfd);
    free(o);
    cl->own = NULL;
    if (close_cb)
        close_cb(cl, close_data);
    baton__client_free(cl);
    return ran + 1;
}
