/* baton/transfer_error.h — the error codes libbaton returns and baton_xfer_strerror. */
#ifndef BATON_TRANSFER_ERROR_H
#define BATON_TRANSFER_ERROR_H

#include "baton/export.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Every libbaton call and callback status is 0 (success) or negative. libbaton's own codes are
 * at -20000 and below (the table below); negative values above that are libuv / errno codes
 * passed through unchanged (UV_ECONNREFUSED, UV_EADDRINUSE, ...), which baton_xfer_strerror
 * understands too. The values are part of the ABI: never renumbered, never reused.
 *
 * The same numbers appear in Baton's own logs and tools under the names BATON_E<name>.
 *
 * XX(name, value, message)
 */
#define BATON_XFER_ERRNO_MAP(XX)                                                                   \
    XX(EINVAL, -20001, "invalid argument")                                                         \
    XX(ENOMEM, -20002, "out of memory")                                                            \
    XX(ECANCELED, -20003, "operation canceled")                                                    \
    XX(EPROTO, -20005, "protocol error")                                                           \
    XX(ETOOBIG, -20006, "message too large")                                                       \
    XX(ENOTFOUND, -20007, "not found")                                                             \
    XX(EEXIST, -20008, "already exists")                                                           \
    XX(ENOTSUP, -20009, "operation not supported")                                                 \
    XX(EBUSY, -20010, "resource busy")                                                             \
    XX(ECONNECT, -20011, "connect to upstream failed")                                             \
    XX(ETIMEOUT_CONNECT, -20012, "timed out connecting")                                           \
    XX(ENODEV, -20018, "no usable device")                                                         \
    XX(EPEERDOWN, -20019, "peer is down")                                                          \
    XX(EABORTED, -20020, "room aborted")                                                           \
    XX(ESTALE, -20021, "stale peer incarnation or generation")                                     \
    XX(ERKEY, -20022, "remote key or bounds check failed")                                         \
    XX(ETIMEOUT, -20024, "timed out")                                                              \
    XX(ESHUTDOWN, -20026, "shutting down")                                                         \
    XX(EAUTH, -20040, "peer failed authentication")

typedef enum {
    BATON_XFER_OK = 0,
#define XX(name, value, msg) BATON_XFER_##name = (value),
    BATON_XFER_ERRNO_MAP(XX)
#undef XX
} baton_xfer_errno_t;

/* A static, human-readable message for a libbaton or libuv/errno code. Any thread. */
BATON_API const char *baton_xfer_strerror(int err);
/* A static name for the code: "BATON_XFER_EPEERDOWN", "ECONNREFUSED", "OK". Any thread. */
BATON_API const char *baton_xfer_err_name(int err);

#ifdef __cplusplus
}
#endif
#endif
