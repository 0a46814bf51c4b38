/* transfer/engine.c — engine lifecycle, the progress thread, and the command/event queues that
 * connect it to the caller's loop. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <unistd.h>

#include "common/log.h"
#include "transfer/internal.h"

/* ---- small helpers ---------------------------------------------------------------------- */

static uint64_t random_u64(void)
{
    uint64_t v = 0;
    if (getrandom(&v, sizeof(v), 0) != (ssize_t)sizeof(v)) {
        /* No entropy source: still distinct per process start. */
        v = uv_hrtime() ^ ((uint64_t)getpid() << 32);
    }
    return v ? v : 1;
}

const char *baton_xfer_transport_name(baton_xfer_transport_t t)
{
    switch (t) {
    case BATON_XFER_TRANSPORT_RDMA:
        return "rdma";
    case BATON_XFER_TRANSPORT_TCP:
        return "tcp";
    case BATON_XFER_TRANSPORT_SHM:
        return "shm";
    default:
        return "none";
    }
}

int baton_xfer_transport_parse(const char *name, baton_xfer_transport_t *t_p)
{
    if (name == NULL)
        return BATON_EINVAL;
    for (int t = BATON_XFER_TRANSPORT_RDMA; t <= BATON_XFER_TRANSPORT_SHM; t++) {
        if (strcmp(name, baton_xfer_transport_name((baton_xfer_transport_t)t)) == 0) {
            *t_p = (baton_xfer_transport_t)t;
            return 0;
        }
    }
    return BATON_EINVAL;
}

void baton_xfer_config_init(baton_xfer_config_t *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->listen_port = 0;
    cfg->transports[0] = BATON_XFER_TRANSPORT_TCP;
    cfg->n_transports = 1;
    cfg->heartbeat_interval_ms = 250;
    cfg->heartbeat_misses = 4;
    cfg->reconnect_min_ms = 50;
    cfg->reconnect_max_ms = 2000;
    cfg->connect_timeout_ms = 2000;
    cfg->room_timeout_ms = 0;
    cfg->slice_size = 64 * 1024;
    cfg->lanes = 4;
    cfg->rdma_qps_per_nic = 2;
    cfg->log_level = -1;
    cfg->max_pending_conns = 512;
    cfg->max_pending_per_addr = 64;
    cfg->pending_buffer_bytes = 8u << 20;
    cfg->size = sizeof(*cfg);
}

/* The oldest config this library reads: 0.1's, which ends with log_level. Fields appended
 * later must be listed after it and defaulted when cfg->size stops short of them. */
#define CONFIG_SIZE_MIN (offsetof(baton_xfer_config_t, log_level) + sizeof(int))

_Static_assert((int)BATON_XFER_LOG_DEBUG == (int)BATON_LOG_DEBUG &&
                   (int)BATON_XFER_LOG_ERROR == (int)BATON_LOG_ERROR,
               "public log levels mirror common/log.h");

static void log_to_host(void *data, baton_log_level_t level, const char *msg)
{
    const baton_xfer_engine_t *eng = data;
    eng->cfg.log_cb(eng->cfg.log_data, (baton_xfer_log_level_t)level, msg);
}

void baton__api_enter(baton_xfer_engine_t *eng, baton__api_scope_t *scope)
{
    if (eng->caller_loop == NULL)
        uv_mutex_lock(&eng->api_lock);
    scope->prev_log = eng->has_log ? baton_log_sink_swap(&eng->log) : NULL;
}

void baton__api_leave(baton_xfer_engine_t *eng, baton__api_scope_t *scope)
{
    if (eng->has_log)
        baton_log_sink_swap(scope->prev_log);
    if (eng->caller_loop == NULL)
        uv_mutex_unlock(&eng->api_lock);
}

static const baton__tp_ops_t *tp_ops_for(baton_xfer_transport_t id)
{
    switch (id) {
    case BATON_XFER_TRANSPORT_TCP:
        return &baton__tp_tcp_ops;
    case BATON_XFER_TRANSPORT_SHM:
        return &baton__tp_shm_ops;
    case BATON_XFER_TRANSPORT_RDMA:
#ifdef BATON_HAVE_RDMA_TP
        return &baton__tp_rdma_ops;
#else
        return NULL;
#endif
    default:
        return NULL;
    }
}

int baton__tp_index(const baton_xfer_engine_t *eng, baton_xfer_transport_t id)
{
    for (int i = 0; i < eng->n_tp; i++)
        if (eng->tp_ids[i] == id)
            return i;
    return -1;
}

/* ---- transport helpers (transport.h) ---------------------------------------------------- */

/* The "not supported" stubs are in tp_notsup.c. */

typedef struct {
    baton_list_t link;
    void (*fn)(void *);
    void *arg;
} deferred_t;

static void defer_run(uv_idle_t *h)
{
    baton_xfer_engine_t *eng = h->data;
    baton_list_t now;
    baton_list_init(&now);
    baton_list_splice(&now, &eng->deferred);
    while (!baton_list_empty(&now)) {
        deferred_t *d = container_of(now.next, deferred_t, link);
        baton_list_remove(&d->link);
        d->fn(d->arg);
        free(d);
    }
    if (baton_list_empty(&eng->deferred)) {
        uv_idle_stop(&eng->defer_idle);
        baton__maybe_finish_shutdown(eng);
    }
}

int baton__tp_defer(const baton__tp_env_t *env, void (*fn)(void *arg), void *arg)
{
    baton_xfer_engine_t *eng = env->priv;
    deferred_t *d = malloc(sizeof(*d));
    if (d == NULL)
        return BATON_ENOMEM;
    d->fn = fn;
    d->arg = arg;
    baton_list_push(&eng->deferred, &d->link);
    uv_idle_start(&eng->defer_idle, defer_run);
    return 0;
}

/* ---- queues ----------------------------------------------------------------------------- */

void baton__cmd_post(baton_xfer_engine_t *eng, baton__cmd_t *cmd)
{
    uv_mutex_lock(&eng->qlock);
    baton_list_push(&eng->cmdq, &cmd->link);
    uv_mutex_unlock(&eng->qlock);
    uv_async_send(&eng->cmd_async);
}

void baton__ev_post(baton_xfer_engine_t *eng, baton__ev_t *ev)
{
    uv_mutex_lock(&eng->qlock);
    baton_list_push(&eng->evq, &ev->link);
    uv_mutex_unlock(&eng->qlock);
    if (eng->caller_loop != NULL) {
        uv_async_send(&eng->caller_async);
    } else {
        uint64_t one = 1;
        /* EAGAIN means the counter is already non-zero: the host is woken anyway. */
        ssize_t w = write(eng->evfd, &one, sizeof(one));
        (void)w;
    }
}

void baton__post_peer_event(baton_xfer_engine_t *eng, const char *endpoint, const char *engine_id,
                            uint64_t inc, baton_xfer_peer_state_t st, baton_xfer_transport_t tp,
                            int reason, uint32_t reconnects)
{
    if (eng->cbs.peer_cb == NULL)
        return;
    baton__ev_t *ev = calloc(1, sizeof(*ev));
    if (ev == NULL) {
        log_warn(BATON__LOG, "peer_event_dropped reason=no_memory");
        return;
    }
    ev->type = BATON__EV_PEER;
    snprintf(ev->u.peer.endpoint, sizeof(ev->u.peer.endpoint), "%s", endpoint ? endpoint : "");
    snprintf(ev->u.peer.engine_id, sizeof(ev->u.peer.engine_id), "%s", engine_id ? engine_id : "");
    ev->u.peer.incarnation = inc;
    ev->u.peer.state = st;
    ev->u.peer.transport = tp;
    ev->u.peer.reason = reason;
    ev->u.peer.reconnects = reconnects;
    baton__ev_post(eng, ev);
}

/* ---- progress thread -------------------------------------------------------------------- */

static void free_droom(baton__droom_t *dr);

static void run_cmd(baton_xfer_engine_t *eng, baton__cmd_t *cmd)
{
    /* Read before dispatching: an embedded command lives inside its droom / wreq, and the
     * handler may already have posted that object's completion event (start_write on an
     * aborted room, an OFFER that fails at once). The caller thread may then free the object,
     * and even calloc the same chunk for a new write (embedded still 0), before the handler
     * returns: reading cmd->embedded afterwards could free the caller's live wreq. */
    const int embedded = cmd->embedded;
    switch (cmd->type) {
    case BATON__CMD_CONNECT: {
        baton__peer_t *p = baton__peer_get(eng, cmd->u.connect.host, cmd->u.connect.port, 1);
        if (p != NULL) {
            p->forget = 0; /* wanted again */
            baton__peer_demand(p);
        }
        break;
    }
    case BATON__CMD_OFFER:
        baton__droom_submit(eng, cmd->u.offer);
        break;
    case BATON__CMD_ABORT:
        baton__droom_abort(eng, cmd->u.abort_room, BATON_EABORTED);
        break;
    case BATON__CMD_WRITE:
        baton__proom_write(eng, cmd->u.write);
        break;
    case BATON__CMD_COMPLETE:
        baton__proom_complete(eng, cmd->u.complete.room, &cmd->u.complete.done);
        baton__room_unref(cmd->u.complete.room);
        break;
    case BATON__CMD_PABORT:
        baton__proom_abort(eng, cmd->u.pabort.room, cmd->u.pabort.reason);
        baton__room_unref(cmd->u.pabort.room);
        break;
    case BATON__CMD_MEM_ADD: {
        baton__lmem_t *m = cmd->u.mem_add;
        baton_list_push(&eng->lmems, &m->link);
        for (baton_list_t *it = eng->conns.next; it != &eng->conns; it = it->next) {
            baton__conn_t *c = container_of(it, baton__conn_t, link);
            if (c->role == BATON__ROLE_DECODE && c->state == BATON__CONN_UP)
                baton__hs_announce_mem(c, m);
        }
        break;
    }
    case BATON__CMD_GRANT:
        baton__proom_grant(eng, cmd->u.grant);
        break;
    case BATON__CMD_SERVE:
        baton__proom_set_serve(eng, cmd->u.serve.cb, cmd->u.serve.data);
        break;
    case BATON__CMD_FORGET: {
        baton__peer_t *p = baton__peer_get(eng, cmd->u.connect.host, cmd->u.connect.port, 0);
        if (p != NULL)
            baton__peer_forget(p);
        break;
    }
    case BATON__CMD_MEM_DEL:
        for (baton_list_t *it = eng->lmems.next; it != &eng->lmems; it = it->next) {
            baton__lmem_t *m = container_of(it, baton__lmem_t, link);
            if (m->id != cmd->u.mem_del)
                continue;
            baton_list_remove(&m->link);
            baton__lmem_free(m);
            break;
        }
        for (baton_list_t *it = eng->conns.next; it != &eng->conns; it = it->next) {
            baton__conn_t *c = container_of(it, baton__conn_t, link);
            /* decode-role connections hold our pages' keys; pullers (prefill role) hold our
             * source regions' keys when a grant announced them (pull by RDMA READ) */
            if (c->state != BATON__CONN_UP || (c->role != BATON__ROLE_DECODE &&
                                               baton_u64map_del(&c->smems, cmd->u.mem_del) == NULL))
                continue;
            baton_buf_t b = BATON_BUF_INIT;
            if (baton__enc_mem_del(&b, cmd->u.mem_del) == 0)
                baton__conn_send(c, &b);
            baton_buf_free(&b);
        }
        break;
    case BATON__CMD_SHUTDOWN:
        eng->shutting_down = 1;
        log_info(BATON__LOG, "engine_shutdown id=%s", eng->engine_id);
        if (eng->listening) {
            eng->listening = 0;
            uv_close((uv_handle_t *)&eng->listener, NULL);
        }
        {
            baton_list_t peers;
            baton_list_init(&peers);
            baton_list_splice(&peers, &eng->peers);
            while (!baton_list_empty(&peers)) {
                baton__peer_t *p = container_of(peers.next, baton__peer_t, link);
                baton_list_remove(&p->link);
                baton_list_push(&eng->peers, &p->link);
                /* Fails queued rooms with ESHUTDOWN and the connection; a peer still resolving
                 * its name stays listed until its callback frees it. */
                baton__peer_free(p);
            }
        }
        for (baton_list_t *it = eng->conns.next; it != &eng->conns;) {
            baton__conn_t *c = container_of(it, baton__conn_t, link);
            it = it->next;
            baton__conn_fail(c, BATON_ESHUTDOWN, "engine shutdown");
        }
        baton__maybe_finish_shutdown(eng);
        break;
    }
    if (!embedded)
        free(cmd);
}

static void on_cmd_async(uv_async_t *h)
{
    baton_xfer_engine_t *eng = h->data;
    baton_list_t q;
    baton_list_init(&q);
    uv_mutex_lock(&eng->qlock);
    baton_list_splice(&q, &eng->cmdq);
    uv_mutex_unlock(&eng->qlock);
    while (!baton_list_empty(&q)) {
        baton__cmd_t *cmd = container_of(q.next, baton__cmd_t, link);
        baton_list_remove(&cmd->link);
        run_cmd(eng, cmd);
    }
}

static void on_tick(uv_timer_t *t)
{
    baton_xfer_engine_t *eng = t->data;
    uint64_t now = baton_now_ms();
    for (baton_list_t *it = eng->peers.next; it != &eng->peers;) {
        baton__peer_t *p = container_of(it, baton__peer_t, link);
        it = it->next;
        if (!baton__peer_forget_due(p))
            baton__peer_tick(p, now);
    }
    for (baton_list_t *it = eng->conns.next; it != &eng->conns;) {
        baton__conn_t *c = container_of(it, baton__conn_t, link);
        it = it->next;
        baton__conn_tick(c, now);
    }
    baton__droom_tick(eng, now);
    baton__proom_cuda_tick(eng);
    /* Own-progress mode: an export deadline is due; wake the host through the engine fd. */
    uint64_t due = atomic_load(&eng->pull_due_ms);
    int idle = 0;
    if (due != 0 && now >= due && atomic_compare_exchange_strong(&eng->wake_posted, &idle, 1))
        baton__ev_post(eng, &eng->wake_ev);
}

void baton__maybe_finish_shutdown(baton_xfer_engine_t *eng)
{
    if (!eng->shutting_down || eng->closed_posted)
        return;
    if (!baton_list_empty(&eng->conns) || !baton_list_empty(&eng->peers) ||
        !baton_list_empty(&eng->deferred) || eng->retiring > 0)
        return;
    eng->closed_posted = 1;
    baton__mem_dereg_all(eng);
    for (int i = 0; i < eng->n_tp; i++)
        eng->tp[i]->ops->fini(eng->tp[i]);
    eng->n_tp = 0;
    while (!baton_list_empty(&eng->lmems)) {
        baton__lmem_t *m = container_of(eng->lmems.next, baton__lmem_t, link);
        baton_list_remove(&m->link);
        baton__lmem_free(m);
    }
    baton_u64map_free(&eng->drooms);
    uv_close((uv_handle_t *)&eng->tick, NULL);
    uv_close((uv_handle_t *)&eng->defer_idle, NULL);
    uv_close((uv_handle_t *)&eng->cmd_async, NULL);
}

static void progress_main(void *arg)
{
    baton_xfer_engine_t *eng = arg;
    if (eng->has_log)
        baton_log_sink_swap(&eng->log); /* this thread logs for this engine only */
    /* Every socket write of the engine happens on this thread. A peer killed mid-write makes
     * the kernel raise SIGPIPE in the writing thread, and its default action ends the HOST
     * process (a library must not impose SIG_IGN on its host): blocked here, it stays pending
     * on this thread only, the write fails with EPIPE and the lane / connection fails as it
     * should (otherwise a holder dies silently with its puller). */
    sigset_t pipe_set;
    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_set, NULL);
    uv_run(&eng->ploop, UV_RUN_DEFAULT);
    int rc = uv_loop_close(&eng->ploop);
    if (rc != 0)
        log_warn(BATON__LOG, "progress_loop_close err=%s", baton_err_name(rc));
    baton__ev_t *ev = calloc(1, sizeof(*ev));
    if (ev == NULL) {
        ev = &eng->closed_fallback;
        ev->embedded = 1;
    }
    ev->type = BATON__EV_CLOSED;
    baton__ev_post(eng, ev);
}

/* ---- caller side: event dispatch -------------------------------------------------------- */

static void free_droom(baton__droom_t *dr)
{
    for (size_t i = 0; i < dr->n_mems; i++)
        atomic_fetch_sub(&dr->mems[i]->refs, 1);
    free(dr->mems);
    free(dr->pages);
    free(dr->layer_seen);
    free(dr->layer_evs);
    free(dr->rd_sges);
    free(dr);
}

void baton__room_unref(baton_xfer_room_t *room)
{
    if (atomic_fetch_sub(&room->refs, 1) != 1)
        return;
    free(room->pages);
    free(room->written);
    free(room);
}

static void deliver_closed(baton_xfer_engine_t *eng, baton_xfer_room_t *room, int status)
{
    room->closed_pending = 0;
    if (!baton__pull_on_closed(eng, room, status) && eng->cbs.room_closed_cb != NULL)
        eng->cbs.room_closed_cb(eng, room, status, eng->cbs.data);
    baton__room_unref(room); /* the caller's reference */
}

/* The last step of destroy, once the progress thread has been joined: frees the engine after
 * the host's close callback returns. */
static void finish_close(baton_xfer_engine_t *eng)
{
    baton__api_scope_t scope = {NULL};
    if (eng->has_log)
        scope.prev_log = baton_log_sink_swap(&eng->log);
    baton__mem_free_all(eng);
    baton_u64map_free(&eng->caller_rooms);
    baton_u64map_free(&eng->exports);
    uv_mutex_destroy(&eng->qlock);
    if (eng->has_log)
        baton_log_sink_swap(scope.prev_log);
    baton_xfer_close_cb cb = eng->close_cb;
    void *data = eng->close_data;
    if (cb != NULL)
        cb(eng, data);
    explicit_bzero(eng->secret, sizeof(eng->secret));
    free(eng);
}

static void caller_closed(uv_handle_t *h)
{
    finish_close(h->data);
}

/* Runs the callbacks of every queued event; returns how many ran. *closed_p: the progress
 * thread has ended (joined): nothing can follow, the caller finishes the close. */
static int dispatch_events(baton_xfer_engine_t *eng, int *closed_p)
{
    int n = 0;
    baton_list_t q;
    baton_list_init(&q);
    uv_mutex_lock(&eng->qlock);
    baton_list_splice(&q, &eng->evq);
    uv_mutex_unlock(&eng->qlock);
    while (!baton_list_empty(&q)) {
        baton__ev_t *ev = container_of(q.next, baton__ev_t, link);
        baton_list_remove(&ev->link);
        n++;
        switch (ev->type) {
        case BATON__EV_OFFER_DONE: {
            baton__droom_t *dr = ev->u.droom;
            baton_u64map_del(&eng->caller_rooms, dr->room_id);
            baton_xfer_done_t done = {dr->done.status, dr->done.first_token, dr->done.payload,
                                      dr->done.len};
            dr->cb(dr->data, dr->room_id, dr->status, dr->status == 0 ? &done : NULL);
            free_droom(dr);
            break;
        }
        case BATON__EV_WAKE:
            /* Cleared before the scan: a deadline that falls due meanwhile posts it again. */
            atomic_store(&eng->wake_posted, 0);
            baton__pull_on_wake(eng);
            break;
        case BATON__EV_LAYER: {
            /* Queued before the room's OFFER_DONE (same FIFO), so dr is still alive. */
            baton__droom_t *dr = ev->u.droom;
            dr->layer_cb(dr->data, dr->room_id, (uint32_t)(ev - dr->layer_evs));
            break;
        }
        case BATON__EV_ROOM: {
            baton_xfer_room_t *room = ev->u.room;
            if (!baton__pull_on_room(eng, room) && eng->cbs.room_cb != NULL)
                eng->cbs.room_cb(eng, room, eng->cbs.data);
            break;
        }
        case BATON__EV_WRITE_DONE: {
            baton__wreq_t *wr = ev->u.wreq;
            baton_xfer_room_t *room = wr->room;
            room->caller_writes--;
            for (size_t i = 0; i < wr->n_mems; i++)
                atomic_fetch_sub(&wr->mems[i]->refs, 1);
            wr->cb(room, wr->layer, ev->status, wr->data);
            free(wr->mems);
            free(wr);
            if (room->closed_pending && room->caller_writes == 0)
                deliver_closed(eng, room, room->closed_status);
            baton__room_unref(room); /* the write's reference */
            break;
        }
        case BATON__EV_ROOM_CLOSED: {
            baton_xfer_room_t *room = ev->u.room;
            /* Every write callback comes before the room's end, also for writes the caller
             * issued after the progress thread had already closed the room. */
            room->caller_ended = 1;
            if (room->caller_writes > 0) {
                room->closed_pending = 1;
                room->closed_status = ev->status;
            } else {
                deliver_closed(eng, room, ev->status);
            }
            break;
        }
        case BATON__EV_PEER: {
            baton_xfer_peer_info_t info = {ev->u.peer.endpoint,    ev->u.peer.engine_id,
                                           ev->u.peer.incarnation, ev->u.peer.state,
                                           ev->u.peer.transport,   ev->u.peer.reason,
                                           ev->u.peer.reconnects};
            if (eng->cbs.peer_cb != NULL)
                eng->cbs.peer_cb(eng, &info, eng->cbs.data);
            free(ev);
            break;
        }
        case BATON__EV_CLOSED:
            if (!ev->embedded)
                free(ev);
            /* Nothing can follow: the progress loop has ended. */
            uv_thread_join(&eng->thread);
            *closed_p = 1;
            return n;
        }
    }
    return n;
}

static void on_caller_async(uv_async_t *h)
{
    baton_xfer_engine_t *eng = h->data;
    baton__api_scope_t scope;
    int closed = 0;
    baton__api_enter(eng, &scope);
    dispatch_events(eng, &closed);
    baton__api_leave(eng, &scope);
    if (closed)
        uv_close((uv_handle_t *)&eng->caller_async, caller_closed);
}

int baton_xfer_engine_fd(const baton_xfer_engine_t *engine)
{
    return engine->caller_loop == NULL ? engine->evfd : -1;
}

int baton_xfer_engine_dispatch(baton_xfer_engine_t *eng)
{
    if (eng == NULL || eng->caller_loop != NULL)
        return BATON_EINVAL;
    baton__api_scope_t scope;
    int closed = 0;
    baton__api_enter(eng, &scope);
    uint64_t count;
    /* Reset before draining: an event queued after the splice writes the fd again. */
    ssize_t r = read(eng->evfd, &count, sizeof(count));
    (void)r;
    int n = dispatch_events(eng, &closed);
    baton__api_leave(eng, &scope);
    if (closed) {
        /* The host makes no other call after destroy (transfer.h), so the lock is free. */
        uv_mutex_destroy(&eng->api_lock);
        close(eng->evfd);
        finish_close(eng);
    }
    return n;
}

/* ---- create / destroy ------------------------------------------------------------------- */

static void env_peer_failed(baton__tp_peer_t *tpp, int err)
{
    baton__conn_t *c = tpp->ctx;
    if (c != NULL && c->tp_peer == tpp)
        baton__conn_fail(c, BATON_EPEERDOWN, baton_strerror(err));
}

static int start_listener(baton_xfer_engine_t *eng)
{
    struct sockaddr_storage ss;
    int rc = uv_ip4_addr(eng->cfg.listen_host, eng->cfg.listen_port, (struct sockaddr_in *)&ss);
    if (rc != 0)
        rc = uv_ip6_addr(eng->cfg.listen_host, eng->cfg.listen_port, (struct sockaddr_in6 *)&ss);
    if (rc != 0) {
        log_error(BATON__LOG, "bootstrap_listen_failed host=%s err=bad_address",
                  eng->cfg.listen_host);
        return BATON_EINVAL;
    }
    uv_tcp_init(&eng->ploop, &eng->listener);
    eng->listener.data = eng;
    eng->listening = 1;
    rc = uv_tcp_bind(&eng->listener, (const struct sockaddr *)&ss, 0);
    if (rc == 0)
        rc = uv_listen((uv_stream_t *)&eng->listener, 512, baton__listener_accept);
    if (rc != 0) {
        log_error(BATON__LOG, "bootstrap_listen_failed host=%s port=%d err=%s",
                  eng->cfg.listen_host, eng->cfg.listen_port, baton_err_name(rc));
        return rc;
    }
    struct sockaddr_storage bound;
    int blen = sizeof(bound);
    uv_tcp_getsockname(&eng->listener, (struct sockaddr *)&bound, &blen);
    int port = ntohs(bound.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&bound)->sin6_port
                                                 : ((struct sockaddr_in *)&bound)->sin_port);
    atomic_store(&eng->port, port);
    return 0;
}

static void close_walk_cb(uv_handle_t *h, void *arg)
{
    if (!uv_is_closing(h))
        uv_close(h, NULL);
}

/* The caller's settings are in range (the engine id printable, a secret long enough). */
static int config_ok(const baton_xfer_config_t *cfg, const baton_xfer_callbacks_t *cbs)
{
    if (cfg->log_level < -1 || cfg->log_level > BATON_XFER_LOG_ERROR)
        return 0;
    if (cfg->listen_host != NULL &&
        (cbs == NULL || cbs->room_cb == NULL || cbs->room_closed_cb == NULL))
        return 0; /* the prefill role must be able to hand rooms over */
    if (cfg->listen_port < 0 || cfg->listen_port > 65535 || cfg->n_transports < 0 ||
        cfg->n_transports > BATON_XFER_MAX_TRANSPORTS)
        return 0;
    if (cfg->engine_id != NULL &&
        (cfg->engine_id[0] == '\0' || strlen(cfg->engine_id) > BATON_XFER_ENGINE_ID_MAX))
        return 0;
    if (cfg->engine_id != NULL)
        for (const char *p = cfg->engine_id; *p; p++)
            if (*p <= 0x20 || *p >= 0x7f)
                return 0;
    if (cfg->lanes > 16)
        return 0;
    if (cfg->secret != NULL &&
        (cfg->secret_len < BATON_XFER_SECRET_MIN || cfg->secret_len > BATON_XFER_SECRET_MAX))
        return 0;
    return 1;
}

/* Each configured transport that this build has and that starts, in the caller's order (the
 * others are logged and skipped: the next one is the fallback). */
static void open_transports(baton_xfer_engine_t *eng)
{
    for (int i = 0; i < eng->cfg.n_transports && eng->n_tp < BATON__MAX_TP; i++) {
        baton_xfer_transport_t id = eng->cfg.transports[i];
        if (baton__tp_index(eng, id) >= 0)
            continue;
        const baton__tp_ops_t *ops = tp_ops_for(id);
        if (ops == NULL) {
            log_warn(BATON__LOG, "transport_unavailable transport=%s err=not_built_in",
                     baton_xfer_transport_name(id));
            continue;
        }
        baton__tp_t *tp = NULL;
        int rc = ops->init(&eng->env, &tp);
        if (rc != 0) {
            log_warn(BATON__LOG, "transport_unavailable transport=%s err=%s fallback=next",
                     ops->name, baton_err_name(rc));
            continue;
        }
        tp->ops = ops;
        tp->env = &eng->env;
        tp->id = id;
        memset(&eng->caps[eng->n_tp], 0, sizeof(eng->caps[0]));
        ops->query(tp, &eng->caps[eng->n_tp]);
        eng->tp_ids[eng->n_tp] = id;
        eng->tp[eng->n_tp++] = tp;
    }
}

/* What the engine runs with: its transports, whether peers must authenticate, its port. */
static void log_started(const baton_xfer_engine_t *eng, const char *listen_host)
{
    char tps[64] = "";
    for (int i = 0; i < eng->n_tp; i++) {
        strcat(tps, i ? "," : "");
        strcat(tps, baton_xfer_transport_name(eng->tp_ids[i]));
    }
    log_info(BATON__LOG, "engine_started id=%s incarnation=%016llx transports=%s kv_auth=%s",
             eng->engine_id, (unsigned long long)eng->incarnation, tps,
             eng->secret_len ? "hmac-sha256" : "off");
    /* no secret: a warning when other hosts can reach the bootstrap port, else (loopback) info */
    const char *lh = listen_host;
    int exposed = lh && strncmp(lh, "127.", 4) && strcmp(lh, "::1") && strcmp(lh, "localhost");
    if (eng->secret_len == 0)
        baton_log(exposed ? BATON_LOG_WARN : BATON_LOG_INFO, BATON__LOG,
                  "kv_auth_disabled id=%s reason=\"no shared secret configured: any "
                  "host that reaches the bootstrap port or connects to it as a peer can "
                  "exchange KV and memory keys with this engine\"",
                  eng->engine_id);
    if (listen_host != NULL) {
        int port = atomic_load(&((baton_xfer_engine_t *)eng)->port);
        if (strchr(listen_host, ':') != NULL)
            log_info(BATON__LOG, "bootstrap_listening addr=[%s]:%d", listen_host, port);
        else
            log_info(BATON__LOG, "bootstrap_listening addr=%s:%d", listen_host, port);
    }
}

static void free_after_close(uv_handle_t *h)
{
    free(h->data);
}

int baton_xfer_engine_create(uv_loop_t *loop, const baton_xfer_config_t *cfg,
                             const baton_xfer_callbacks_t *cbs, baton_xfer_engine_t **engine_p)
{
    if (cfg == NULL || engine_p == NULL || cfg->size < CONFIG_SIZE_MIN)
        return BATON_EINVAL;
    /* Read only the bytes the program knows of; later fields keep their defaults. */
    baton_xfer_config_t def;
    baton_xfer_config_init(&def);
    baton_xfer_config_t known = def;
    memcpy(&known, cfg, cfg->size < sizeof(known) ? cfg->size : sizeof(known));
    known.size = sizeof(known);
    cfg = &known;
    if (!config_ok(cfg, cbs))
        return BATON_EINVAL;

    baton_xfer_engine_t *eng = calloc(1, sizeof(*eng));
    if (eng == NULL)
        return BATON_ENOMEM;
    eng->cfg = *cfg;
    if (cbs != NULL)
        eng->cbs = *cbs;
#define DEF(f)                                                                                     \
    if (eng->cfg.f == 0)                                                                           \
    eng->cfg.f = def.f
    DEF(heartbeat_interval_ms);
    DEF(heartbeat_misses);
    DEF(reconnect_min_ms);
    DEF(reconnect_max_ms);
    DEF(connect_timeout_ms);
    DEF(slice_size);
    DEF(lanes);
    DEF(rdma_qps_per_nic);
    DEF(max_pending_conns);
    DEF(max_pending_per_addr);
    DEF(pending_buffer_bytes);
#undef DEF
    if (eng->cfg.n_transports == 0) {
        eng->cfg.transports[0] = BATON_XFER_TRANSPORT_TCP;
        eng->cfg.n_transports = 1;
    }
    if (cfg->engine_id != NULL) {
        snprintf(eng->engine_id, sizeof(eng->engine_id), "%s", cfg->engine_id);
    } else {
        char host[64] = "host";
        gethostname(host, sizeof(host) - 1);
        host[sizeof(host) - 1] = '\0';
        for (char *p = host; *p; p++)
            if (*p <= 0x20 || *p >= 0x7f)
                *p = '_';
        snprintf(eng->engine_id, sizeof(eng->engine_id), "%.40s-%d", host, (int)getpid());
    }
    eng->cfg.engine_id = eng->engine_id;
    if (cfg->secret != NULL) {
        memcpy(eng->secret, cfg->secret, cfg->secret_len);
        eng->secret_len = cfg->secret_len;
    }
    eng->cfg.secret = NULL; /* only the engine's copy is used, and never handed out */
    eng->cfg.secret_len = 0;
    if (cfg->rdma_devices != NULL) {
        snprintf(eng->rdma_devices, sizeof(eng->rdma_devices), "%s", cfg->rdma_devices);
        eng->cfg.rdma_devices = eng->rdma_devices;
    }
    eng->cfg.listen_host = NULL; /* not kept: only used below */
    eng->incarnation = random_u64();
    eng->caller_loop = loop;
    eng->next_mem_id = 1;
    eng->next_gen = (random_u64() & 0xffffffff00000000ull) | 1;
    eng->tick_ms = eng->cfg.heartbeat_interval_ms / 5;
    if (eng->tick_ms < 5)
        eng->tick_ms = 5;
    if (eng->tick_ms > 50)
        eng->tick_ms = 50;
    baton_u64map_init(&eng->caller_rooms);
    baton_u64map_init(&eng->exports);
    eng->wake_ev.type = BATON__EV_WAKE;
    eng->wake_ev.embedded = 1;
    baton_u64map_init(&eng->drooms);
    baton_list_init(&eng->cmdq);
    baton_list_init(&eng->evq);
    baton_list_init(&eng->deferred);
    baton_list_init(&eng->peers);
    baton_list_init(&eng->conns);
    baton_list_init(&eng->lmems);
    baton_list_init(&eng->cuda_waits);
    if (eng->cfg.log_cb != NULL || eng->cfg.log_level >= 0) {
        eng->log.fn = eng->cfg.log_cb != NULL ? log_to_host : NULL;
        eng->log.data = eng;
        eng->log.level = eng->cfg.log_level;
        eng->has_log = 1;
    }
    /* Resources in order; a failure unwinds what was taken, in reverse (the ladder below). */
    int rc = BATON_ENOMEM, async_open = 0;
    if (uv_mutex_init(&eng->qlock) != 0)
        goto fail_free;
    if (loop == NULL) {
        eng->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        if (eng->evfd < 0) {
            rc = uv_translate_sys_error(errno);
            goto fail_qlock;
        }
        if (uv_mutex_init_recursive(&eng->api_lock) != 0) {
            rc = BATON_ENOMEM;
            goto fail_evfd;
        }
    }
    if ((rc = uv_loop_init(&eng->ploop)) != 0)
        goto fail_api_lock;
    /* Lines logged while creating go to this engine's sink too (undone on every exit). */
    if (eng->has_log)
        eng->create_prev_log = baton_log_sink_swap(&eng->log);
    uv_async_init(&eng->ploop, &eng->cmd_async, on_cmd_async);
    eng->cmd_async.data = eng;
    uv_timer_init(&eng->ploop, &eng->tick);
    eng->tick.data = eng;
    uv_idle_init(&eng->ploop, &eng->defer_idle);
    eng->defer_idle.data = eng;

    eng->env.loop = &eng->ploop;
    eng->env.cfg = &eng->cfg;
    eng->env.engine_id = eng->engine_id;
    eng->env.incarnation = eng->incarnation;
    eng->env.priv = eng;
    eng->env.peer_failed = env_peer_failed;
    eng->env.resolve_dst = baton__resolve_dst;
    eng->env.placed = baton__placed;
    eng->env.staged_bytes = &eng->st_staged_bytes;
    eng->env.stage_buffer_bytes = &eng->st_stage_buffer_bytes;

    open_transports(eng);
    if (eng->n_tp == 0) {
        log_error(BATON__LOG, "engine_create_failed err=no_usable_transport");
        rc = BATON_ENODEV;
        goto fail_ploop;
    }
    if (cfg->listen_host != NULL) {
        eng->cfg.listen_host = cfg->listen_host;
        rc = start_listener(eng);
        eng->cfg.listen_host = NULL;
        if (rc != 0)
            goto fail_ploop;
    }
    if (loop != NULL) {
        if ((rc = uv_async_init(loop, &eng->caller_async, on_caller_async)) != 0)
            goto fail_ploop;
        eng->caller_async.data = eng;
        async_open = 1;
    }
    uv_timer_start(&eng->tick, on_tick, eng->tick_ms, eng->tick_ms);
    if ((rc = uv_thread_create(&eng->thread, progress_main, eng)) != 0)
        goto fail_ploop;
    eng->thread_started = 1;
    log_started(eng, cfg->listen_host);
    if (eng->has_log)
        baton_log_sink_swap(eng->create_prev_log);
    *engine_p = eng;
    return 0;

fail_ploop: /* the progress loop, its handles and the transports on it */
    for (int i = 0; i < eng->n_tp; i++)
        eng->tp[i]->ops->fini(eng->tp[i]);
    uv_walk(&eng->ploop, close_walk_cb, NULL);
    uv_run(&eng->ploop, UV_RUN_DEFAULT);
    uv_loop_close(&eng->ploop);
    if (eng->has_log)
        baton_log_sink_swap(eng->create_prev_log); /* create's own scope ends on failure */
fail_api_lock:
    if (loop == NULL)
        uv_mutex_destroy(&eng->api_lock);
fail_evfd:
    if (loop == NULL)
        close(eng->evfd);
fail_qlock:
    uv_mutex_destroy(&eng->qlock);
fail_free:
    explicit_bzero(eng->secret, sizeof(eng->secret));
    if (async_open) /* on the caller's loop: the engine is freed by its close callback */
        uv_close((uv_handle_t *)&eng->caller_async, free_after_close);
    else
        free(eng);
    return rc;
}

int baton_xfer_engine_listen_port(const baton_xfer_engine_t *engine)
{
    return atomic_load(&((baton_xfer_engine_t *)engine)->port);
}

const char *baton_xfer_engine_id(const baton_xfer_engine_t *engine)
{
    return engine->engine_id;
}

uint64_t baton_xfer_engine_incarnation(const baton_xfer_engine_t *engine)
{
    return engine->incarnation;
}

int baton_xfer_engine_transports(const baton_xfer_engine_t *engine, baton_xfer_transport_t *out,
                                 int cap)
{
    int n = 0;
    for (int i = 0; i < engine->n_tp && n < cap; i++)
        out[n++] = engine->tp_ids[i];
    return n;
}

void baton_xfer_engine_destroy(baton_xfer_engine_t *engine, baton_xfer_close_cb close_cb,
                               void *data)
{
    if (engine == NULL)
        return;
    baton__api_scope_t scope;
    baton__api_enter(engine, &scope);
    if (!engine->destroying) {
        engine->destroying = 1;
        baton__pull_drop_all(engine);
        engine->close_cb = close_cb;
        engine->close_data = data;
        baton__cmd_t *cmd = calloc(1, sizeof(*cmd));
        if (cmd == NULL) {
            cmd = &engine->shutdown_fallback; /* shutdown must not fail for lack of 100 bytes */
            cmd->embedded = 1;
        }
        cmd->type = BATON__CMD_SHUTDOWN;
        baton__cmd_post(engine, cmd);
    }
    baton__api_leave(engine, &scope);
}
