/* kvxfer_metrics.c — the KV hand-off's Prometheus series: rooms by result and failure reason,
 * bytes, transfer times, peers, reconnects, refused frames and writes, the page pool. */
#include "baton/error.h"
#include "common/clock.h"
#include "worker/kvxfer_int.h"

const char *wk__kv_reason_of(int status)
{
    switch (status) {
    case BATON_EABORTED:
        return "aborted";
    case BATON_EPEERDOWN:
        return "peer_down";
    case WK_EUNREACHABLE:
        return "unreachable";
    case WK_EMISMATCH:
        return "mismatch";
    case BATON_EKVCORRUPT:
        return "kv_corrupted";
    case BATON_ENOTSUP:
    case BATON_ERKEY:
    case BATON_ESTALE:
    case BATON_EEXIST:
        return "refused";
    case BATON_ESHUTDOWN:
        return "shutdown";
    case BATON_ETIMEOUT:
        return "timeout";
    case BATON_ECANCELED:
        return "canceled";
    case BATON_ENOMEM:
        return "nomem";
    default:
        return "other";
    }
}

void wk__kv_count_fail(wk_kv_t *kv, const char *reason)
{
    const char *lv[1] = {reason};
    baton_counter_add(kv->m_failed, 1);
    baton_counter_inc_labels(kv->f_fail, lv);
}

void wk__kv_observe_since(baton_metric_child_t *h, uint64_t t0_ns)
{
    if (t0_ns)
        baton_histogram_observe(h, baton_seconds_since(t0_ns));
}

void wk__kv_metrics_init(wk_kv_t *kv, baton_metrics_t *m)
{
    if (m == NULL)
        return;
    static const char *const res[] = {"result"}, *const reason[] = {"reason"},
                             *const dir[] = {"direction"}, *const state[] = {"state"};
    baton_metric_family_t *f;
    f = baton_metrics_counter(m, "baton_kv_rooms_total",
                              "KV hand-offs (rooms) finished, by result.", 1, res);
    if (f) {
        static const char *const ok[] = {"ok"}, *const failed[] = {"failed"};
        kv->m_ok = baton_metric_child(f, ok);
        kv->m_failed = baton_metric_child(f, failed);
    }
    kv->f_fail = baton_metrics_counter(m, "baton_kv_room_failures_total",
                                       "Failed KV hand-offs (rooms), by reason.", 1, reason);
    f = baton_metrics_counter(m, "baton_kv_bytes_total",
                              "KV bytes moved: sent (prefill, acknowledged in place) or received "
                              "(decode, rooms completed).",
                              1, dir);
    if (f) {
        const char *lv[1] = {kv->cfg.prefill ? "sent" : "received"};
        kv->m_bytes = baton_metric_child(f, lv);
    }
    f = baton_metrics_histogram(m, "baton_kv_transfer_seconds",
                                kv->cfg.prefill
                                    ? "Prefill: time from a room's first write to its DONE."
                                    : "Decode: time from the offer of a room to its DONE.",
                                0, NULL, baton_latency_buckets, baton_latency_buckets_n);
    kv->m_xfer = baton_metric_child(f, NULL);
    if (kv->cfg.prefill) {
        f = baton_metrics_histogram(m, "baton_kv_transfer_tail_seconds",
                                    "Prefill: time from the end of a room's compute to its DONE "
                                    "(the transfer not hidden behind compute).",
                                    0, NULL, baton_latency_buckets, baton_latency_buckets_n);
        kv->m_tail = baton_metric_child(f, NULL);
    }
    f = baton_metrics_gauge(m, "baton_kv_peers", "Transfer-engine peers by state.", 1, state);
    if (f) {
        static const char *const up[] = {"up"}, *const down[] = {"down"};
        kv->m_up = baton_metric_child(f, up);
        kv->m_down = baton_metric_child(f, down);
    }
    f = baton_metrics_counter(m, "baton_kv_reconnects_total",
                              "Successful re-handshakes with a peer after a failure.", 0, NULL);
    kv->m_reconn = baton_metric_child(f, NULL);
    f = baton_metrics_counter(m, "baton_kv_corrupted_total",
                              "Rooms whose received KV failed verification (kv_corrupted).", 0,
                              NULL);
    kv->m_corrupt = baton_metric_child(f, NULL);
    f = baton_metrics_counter(m, "baton_kv_frames_rejected_total",
                              "Control-channel frames refused (malformed, oversized, out of "
                              "order); each closed its connection.",
                              0, NULL);
    kv->m_frames_rej = baton_metric_child(f, NULL);
    f = baton_metrics_counter(m, "baton_kv_writes_rejected_total",
                              "Writes refused by the receiver's bounds / key checks.", 0, NULL);
    kv->m_writes_rej = baton_metric_child(f, NULL);
    f = baton_metrics_counter(
        m, "baton_kv_auth_failures_total",
        "Control connections refused by the KV bootstrap's challenge-response "
        "(no or wrong shared secret, replayed handshake).",
        0, NULL);
    kv->m_auth_fail = baton_metric_child(f, NULL);
    f = baton_metrics_gauge(m, "baton_kv_pending_connections",
                            "Accepted KV control connections not through their handshake (and "
                            "authentication) yet; at most --kv-max-pending.",
                            0, NULL);
    kv->m_pending = baton_metric_child(f, NULL);
    f = baton_metrics_gauge(m, "baton_kv_pending_buffer_bytes",
                            "Read-buffer bytes held for those connections; at most "
                            "--kv-pending-buffer-bytes.",
                            0, NULL);
    kv->m_pending_bytes = baton_metric_child(f, NULL);
    f = baton_metrics_counter(m, "baton_kv_connections_refused_total",
                              "KV control connections closed before their handshake for a pending "
                              "cap (--kv-max-pending, --kv-max-pending-per-addr) or the "
                              "pending buffer budget.",
                              0, NULL);
    kv->m_refused = baton_metric_child(f, NULL);
    f = baton_metrics_gauge(m, "baton_kv_pool_slots",
                            "KV page slots (one page in every layer), by state.", 1, state);
    if (f) {
        static const char *const fr[] = {"free"}, *const us[] = {"used"};
        kv->m_free = baton_metric_child(f, fr);
        kv->m_used = baton_metric_child(f, us);
    }
    f = baton_metrics_gauge(m, "baton_kv_pool_waiting", "Requests waiting for KV page slots.", 0,
                            NULL);
    kv->m_waiting = baton_metric_child(f, NULL);
    f = baton_metrics_counter(m, "baton_kv_pages_skipped_total",
                              "KV pages (one layer's page each) not transferred because the decode "
                              "kept them in its prefix cache (decode: not offered; prefill: not "
                              "written).",
                              0, NULL);
    kv->m_skipped = baton_metric_child(f, NULL);
}

static void add_delta(baton_metric_child_t *c, uint64_t now, uint64_t *seen)
{
    if (now > *seen) {
        baton_counter_add(c, (double)(now - *seen));
        *seen = now;
    }
}

void wk_kv_metrics_sync(wk_kv_t *kv)
{
    if (kv->eng == NULL)
        return;
    baton_xfer_stats_t st;
    baton_xfer_engine_stats_sized(kv->eng, &st, sizeof(st));
    add_delta(kv->m_bytes, kv->cfg.prefill ? st.bytes_written : st.bytes_received,
              kv->cfg.prefill ? &kv->seen.bytes_written : &kv->seen.bytes_received);
    add_delta(kv->m_reconn, st.reconnects, &kv->seen.reconnects);
    add_delta(kv->m_frames_rej, st.frames_rejected, &kv->seen.frames_rejected);
    add_delta(kv->m_writes_rej, st.writes_rejected, &kv->seen.writes_rejected);
    add_delta(kv->m_auth_fail, st.auth_failures, &kv->seen.auth_failures);
    add_delta(kv->m_refused, st.conns_refused, &kv->seen.conns_refused);
    baton_gauge_set(kv->m_pending, (double)st.pending_conns);
    baton_gauge_set(kv->m_pending_bytes, (double)st.pending_bytes);
    baton_gauge_set(kv->m_up, (double)st.peers_up);
    baton_gauge_set(kv->m_down, (double)st.peers_down);
    baton_gauge_set(kv->m_free, kv->pool.n_free);
    baton_gauge_set(kv->m_used, kv->pool.n_slots - kv->pool.n_free);
    baton_gauge_set(kv->m_waiting, kv->pool.n_waiting);
}
