/* transfer/ctrl_admit.c — what the bootstrap listener holds for peers that are not UP yet: the
 * per-engine and per-address caps on pending connections and the budget of their read buffers. */
#include <string.h>

#include "common/log.h"
#include "transfer/internal.h"

/* A pending connection may only send handshake frames (the largest a HELLO of about 16 KiB):
 * its buffer grows in small steps, each charged to the budget before it is taken. */
#define PENDING_READ_STEP 4096

static void set_gauges(baton_xfer_engine_t *eng, uint64_t conns, uint64_t bytes)
{
    atomic_store_explicit(&eng->st_pending_conns, conns, memory_order_relaxed);
    atomic_store_explicit(&eng->st_pending_bytes, bytes, memory_order_relaxed);
}

static uint64_t pending_conns(const baton_xfer_engine_t *eng)
{
    return atomic_load_explicit(&eng->st_pending_conns, memory_order_relaxed);
}

static uint64_t pending_bytes(const baton_xfer_engine_t *eng)
{
    return atomic_load_explicit(&eng->st_pending_bytes, memory_order_relaxed);
}

int baton__admit_accept(baton__conn_t *c, const char **why)
{
    baton_xfer_engine_t *eng = c->eng;
    int refused = 0;
    if (pending_conns(eng) >= eng->cfg.max_pending_conns) {
        *why = "too many pending connections";
        refused = 1;
    } else {
        uint32_t same = 0;
        for (baton_list_t *it = eng->conns.next; it != &eng->conns; it = it->next) {
            const baton__conn_t *o = container_of(it, baton__conn_t, link);
            if (o->admitted && strcmp(o->ip, c->ip) == 0)
                same++;
        }
        if (same >= eng->cfg.max_pending_per_addr) {
            *why = "too many pending connections from this address";
            refused = 1;
        }
    }
    if (refused) {
        atomic_fetch_add(&eng->st_conns_refused, 1);
        return BATON_EBUSY;
    }
    c->admitted = 1;
    set_gauges(eng, pending_conns(eng) + 1, pending_bytes(eng));
    return 0;
}

int baton__admit_reserve(baton__conn_t *c)
{
    if (!c->admitted)
        return baton_buf_reserve(&c->rbuf, 64 * 1024);
    baton_xfer_engine_t *eng = c->eng;
    size_t cap = c->rbuf.cap;
    if (cap - c->rbuf.len > PENDING_READ_STEP / 2)
        return 0; /* room left from the last step */
    /* What the reserve below would grow the buffer to (baton_buf_reserve doubles). */
    size_t need = c->rbuf.len + PENDING_READ_STEP;
    size_t next = cap ? cap : 64;
    while (next < need)
        next *= 2;
    if (pending_bytes(eng) + (next - cap) > eng->cfg.pending_buffer_bytes) {
        atomic_fetch_add(&eng->st_conns_refused, 1);
        return BATON_EBUSY;
    }
    if (baton_buf_reserve(&c->rbuf, PENDING_READ_STEP - 1) != 0)
        return BATON_ENOMEM;
    size_t grown = c->rbuf.cap - cap;
    c->charged += grown;
    set_gauges(eng, pending_conns(eng), pending_bytes(eng) + grown);
    return 0;
}

void baton__admit_release(baton__conn_t *c)
{
    if (!c->admitted)
        return;
    baton_xfer_engine_t *eng = c->eng;
    c->admitted = 0;
    set_gauges(eng, pending_conns(eng) - 1, pending_bytes(eng) - c->charged);
    c->charged = 0;
}
