/* tp_notsup.c — the transports' "not supported" entries (transport.h): an op a transport lacks
 * points here, never at NULL, so callers need no NULL checks and get BATON_ENOTSUP. */
#include "baton/error.h"
#include "transfer/internal.h"

int baton__tp_notsup_flush(baton__tp_peer_t *peer, baton__tp_done_cb cb, void *arg)
{
    return BATON_ENOTSUP;
}

int baton__tp_notsup_adopt_lane(baton__tp_peer_t *peer, uv_tcp_t *stream, uint32_t lane_index,
                                const uint8_t *rest, size_t rest_len)
{
    return BATON_ENOTSUP;
}

int baton__tp_notsup_mem_add(baton__tp_peer_t *peer, uint32_t mem_id, uint64_t base, uint64_t len,
                             baton_xfer_mem_kind_t kind, const uint8_t *blob, size_t blob_len)
{
    return BATON_ENOTSUP;
}

int baton__tp_notsup_read(baton__tp_peer_t *peer, baton__tp_write_t *w)
{
    (void)peer;
    (void)w;
    return BATON_ENOTSUP;
}

int baton__tp_notsup_mem_del(baton__tp_peer_t *peer, uint32_t mem_id)
{
    return BATON_ENOTSUP;
}
