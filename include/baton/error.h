/* baton/error.h — the project-wide error enum: 0 is success, every error is negative. */
#ifndef BATON_ERROR_H
#define BATON_ERROR_H

#include "baton/transfer_error.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Baton's own errors live at -20000 and below. Negative values above that are libuv / errno
 * codes passed through unchanged (UV_ECONNREFUSED, UV_ETIMEDOUT, ...); baton_strerror() and
 * baton_err_name() understand both.
 *
 * The codes libbaton can return are its public table, BATON_XFER_ERRNO_MAP in
 * baton/transfer_error.h (installed with the library); the codes below are the rest of the
 * project's (router, worker, health), never returned by libbaton. This header is internal
 * (not installed): it joins both tables into one enum with the same values, so the tree names
 * every code BATON_E<name> whichever table it comes from.
 *
 * XX(name, value, message)
 */
#define BATON_APP_ERRNO_MAP(XX)                                                                    \
    XX(ECLOSED, -20004, "connection closed")                                                       \
    XX(ETIMEOUT_FIRST_BYTE, -20013, "timed out waiting for the first byte")                        \
    XX(ETIMEOUT_IDLE, -20014, "timed out: connection idle")                                        \
    XX(ETIMEOUT_TOTAL, -20015, "timed out: total deadline exceeded")                               \
    XX(EUPSTREAM, -20016, "upstream sent a malformed response")                                    \
    XX(EEOF, -20017, "peer closed the connection early")                                           \
    XX(EKVCORRUPT, -20023, "KV cache page verification failed")                                    \
    XX(ENOWORKER, -20025, "no worker available")                                                   \
    XX(ETLS, -20041, "TLS handshake or certificate verification failed")

/* Every code of the project: libbaton's table, then the rest. */
#define BATON_ERRNO_MAP(XX) BATON_XFER_ERRNO_MAP(XX) BATON_APP_ERRNO_MAP(XX)

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
