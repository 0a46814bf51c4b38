/* baton/error.h — the project-wide error enum: 0 is success, every error is negative. */
#ifndef BATON_ERROR_H
#define BATON_ERROR_H

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Baton's own errors live at -20000 and below. Negative values above that are libuv / errno
 * codes passed through unchanged (UV_ECONNREFUSED, UV_ETIMEDOUT, ...); baton_strerror() and
 * baton_err_name() understand both.
 *
 * XX(name, value, message)
 */
#define BATON_ERRNO_MAP(XX)                                                                        \
    XX(EINVAL, -20001, "invalid argument")                                                         \
    XX(ENOMEM, -20002, "out of memory")                                                            \
    XX(ECANCELED, -20003, "operation canceled")                                                    \
    XX(ECLOSED, -20004, "connection closed")                                                       \
    XX(EPROTO, -20005, "protocol error")                                                           \
    XX(ETOOBIG, -20006, "message too large")                                                       \
    XX(ENOTFOUND, -20007, "not found")                                                             \
    XX(EEXIST, -20008, "already exists")                                                           \
    XX(ENOTSUP, -20009, "operation not supported")                                                 \
    XX(EBUSY, -20010, "resource busy")                                                             \
    XX(ECONNECT, -20011, "connect to upstream failed")                                             \
    XX(ETIMEOUT_CONNECT, -20012, "timed out connecting")                                           \
    XX(ETIMEOUT_FIRST_BYTE, -20013, "timed out waiting for the first byte")                        \
    XX(ETIMEOUT_IDLE, -20014, "timed out: connection idle")                                        \
    XX(ETIMEOUT_TOTAL, -20015, "timed out: total deadline exceeded")                               \
    XX(EUPSTREAM, -20016, "upstream sent a malformed response")                                    \
    XX(EEOF, -20017, "peer closed the connection early")                                           \
    XX(ENODEV, -20018, "no usable device")                                                         \
    XX(EPEERDOWN, -20019, "peer is down")                                                          \
    XX(EABORTED, -20020, "room aborted")                                                           \
    XX(ESTALE, -20021, "stale peer incarnation or generation")                                     \
    XX(ERKEY, -20022, "remote key or bounds check failed")                                         \
    XX(EKVCORRUPT, -20023, "KV cache page verification failed")                                    \
    XX(ETIMEOUT, -20024, "timed out")                                                              \
    XX(ENOWORKER, -20025, "no worker available")                                                   \
    XX(ESHUTDOWN, -20026, "shutting down")

typedef enum {
    BATON_OK = 0,
#define XX(name, value, msg) BATON_##name = (value),
    BATON_ERRNO_MAP(XX)
#undef XX
} baton_errno_t;

/* A static, human-readable message for any Baton or libuv/errno code. */
const char *baton_strerror(int err);

/* A static name for the code, e.g. "BATON_ETIMEOUT_IDLE" or "ECONNREFUSED". */
const char *baton_err_name(int err);

#ifdef __cplusplus
}
#endif
#endif
