/* transfer/engine_stats.c — the engine's counters (relaxed atomics, any thread) as the public
 * stats snapshot, sized for callers built against an older, smaller struct. */
#include <string.h>

#include "transfer/internal.h"

void baton_xfer_engine_stats(const baton_xfer_engine_t *engine, baton_xfer_stats_t *s)
{
    baton_xfer_engine_t *e = (baton_xfer_engine_t *)engine;
    s->bytes_written = atomic_load_explicit(&e->st_bytes_written, memory_order_relaxed);
    s->bytes_received = atomic_load_explicit(&e->st_bytes_received, memory_order_relaxed);
    s->rooms_done = atomic_load_explicit(&e->st_rooms_done, memory_order_relaxed);
    s->rooms_failed = atomic_load_explicit(&e->st_rooms_failed, memory_order_relaxed);
    s->rooms_aborted = atomic_load_explicit(&e->st_rooms_aborted, memory_order_relaxed);
    s->peers_up = atomic_load_explicit(&e->st_peers_up, memory_order_relaxed);
    s->peers_down = atomic_load_explicit(&e->st_peers_down, memory_order_relaxed);
    s->reconnects = atomic_load_explicit(&e->st_reconnects, memory_order_relaxed);
    s->frames_rejected = atomic_load_explicit(&e->st_frames_rejected, memory_order_relaxed);
    s->writes_rejected = atomic_load_explicit(&e->st_writes_rejected, memory_order_relaxed);
}

void baton_xfer_engine_stats_sized(const baton_xfer_engine_t *engine, baton_xfer_stats_t *s,
                                   size_t size)
{
    baton_xfer_stats_t all;
    baton_xfer_engine_stats(engine, &all);
    baton_xfer_engine_t *e = (baton_xfer_engine_t *)engine;
    all.auth_failures = atomic_load_explicit(&e->st_auth_failures, memory_order_relaxed);
    all.pending_conns = atomic_load_explicit(&e->st_pending_conns, memory_order_relaxed);
    all.pending_bytes = atomic_load_explicit(&e->st_pending_bytes, memory_order_relaxed);
    all.conns_refused = atomic_load_explicit(&e->st_conns_refused, memory_order_relaxed);
    all.staged_bytes = atomic_load_explicit(&e->st_staged_bytes, memory_order_relaxed);
    all.stage_buffer_bytes = atomic_load_explicit(&e->st_stage_buffer_bytes, memory_order_relaxed);
    all.peers = atomic_load_explicit(&e->st_peers, memory_order_relaxed);
    all.peers_forgotten = atomic_load_explicit(&e->st_peers_forgotten, memory_order_relaxed);
    memcpy(s, &all, size < sizeof(all) ? size : sizeof(all));
}
