/* server_budget.c — the HTTP server's memory: the shared budget, freeing the spare buffers. */
#include "http/server_internal.h"

#include "common/log.h"

/* How often connections waiting for the memory budget look again. */
#define BUDGET_POLL_MS 20

void baton__hs_budget_add(srv_t *srv, size_t n)
{
    if (srv->budget && n)
        atomic_fetch_add(&srv->budget->used, n);
}

void baton__hs_budget_sub(srv_t *srv, size_t n)
{
    if (srv->budget && n)
        atomic_fetch_sub(&srv->budget->used, n);
}

/*
 * Whether c may read more of its body now. A body with a Content-Length is admitted whole: its
 * length is charged at once (all or nothing), so bodies never each hold part of the budget
 * while all wait for more (a deadlock only the body timeout would break). A chunked body is
 * charged as it is read, one read at a time. Whatever the limit, a body that is the only thing
 * in the budget goes on (else a body over the budget could never finish). Small bodies that do
 * not fit take the separate reserve, so a big body cannot starve them.
 */
int baton__hs_budget_admit(conn_t *c)
{
    baton_http_budget_t *b = c->srv->budget;
    if (b == NULL || b->max == 0 || (c->state != CS_BODY && c->state != CS_BODY_WAIT) ||
        c->reserved)
        return 1; /* a closing connection's reads are dropped, never buffered */
    size_t used = atomic_load(&b->used);
    size_t others = used > c->charged ? used - c->charged : 0; /* c->charged: main budget here */
    if (c->body_total == 0)                                    /* chunked */
        return others == 0 || (used < b->max && BATON__HS_READ_BUF <= b->max - used);
    if (others == 0 || (others < b->max && c->body_total <= b->max - others)) {
        baton__hs_budget_add(c->srv, c->body_total - c->charged);
        c->charged = c->body_total;
        c->reserved = 1;
        return 1;
    }
    if (!c->small_body)
        return 0;
    size_t rmax = b->max / 8;
    size_t rused = atomic_fetch_add(&b->reserve_used, c->body_total);
    if (rused > rmax || c->body_total > rmax - rused) {
        atomic_fetch_sub(&b->reserve_used, c->body_total);
        return 0;
    }
    baton__hs_budget_sub(c->srv, c->charged); /* bytes read before the reservation move over */
    c->charged = c->body_total;
    c->reserved = 1;
    c->in_reserve = 1;
    return 1;
}

void baton__hs_body_release(conn_t *c)
{
    if (c->in_reserve && c->srv->budget)
        atomic_fetch_sub(&c->srv->budget->reserve_used, c->charged);
    else
        baton__hs_budget_sub(c->srv, c->charged);
    c->charged = 0;
    c->in_reserve = 0;
}

static void on_budget_timer(uv_timer_t *t)
{
    srv_t *srv = t->data;
    int waiting = 0;
    for (baton_list_t *it = srv->conns.next; it != &srv->conns; it = it->next) {
        conn_t *c = container_of(it, conn_t, link);
        if (c->state != CS_BODY_WAIT) /* a closing connection is never waiting */
            continue;
        if (!baton__hs_budget_admit(c)) {
            waiting++;
            continue;
        }
        baton__hs_set_state(c, CS_BODY);
        c->read_stopped = 0;
        baton__hs_read_start(c);
    }
    if (!waiting)
        uv_timer_stop(t);
}

/* libuv reported UV_ENOBUFS: on_alloc refused a buffer because the budget is full. */
void baton__hs_budget_wait(conn_t *c)
{
    srv_t *srv = c->srv;
    uv_read_stop((uv_stream_t *)&c->tcp);
    c->read_stopped = 1;
    if (c->state == CS_BODY) {
        baton__hs_set_state(c, CS_BODY_WAIT);
        atomic_fetch_add(&srv->budget->waits, 1);
        log_warn_limited("http", "body_waits_for_budget",
                         "body_waits_for_budget used=%zu max=%zu peer=%s",
                         atomic_load(&srv->budget->used), srv->budget->max, c->req.peer);
    }
    if (!uv_is_active((uv_handle_t *)&srv->budget_timer))
        uv_timer_start(&srv->budget_timer, on_budget_timer, BUDGET_POLL_MS, BUDGET_POLL_MS);
}

void baton__hs_spare_free(baton__hs_spare_t *s)
{
    while (s->n > 0)
        baton_buf_free(&s->b[--s->n]);
}
