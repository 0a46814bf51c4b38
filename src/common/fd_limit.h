/* common/fd_limit.h — the process's descriptor limit, raised to what the system allows. */
#ifndef BATON_COMMON_FD_LIMIT_H
#define BATON_COMMON_FD_LIMIT_H

#include <stdint.h>

typedef struct {
    uint64_t before; /* the soft limit found */
    uint64_t soft;   /* the soft limit now (no limit: 1 << 30) */
    uint64_t hard;   /* the hard limit (no limit: 1 << 30) */
} baton_fd_limit_t;

/*
 * Raises the soft RLIMIT_NOFILE to the hard one: a server that keeps the common default of 1024
 * runs out of descriptors under a few hundred idle connections and then cannot accept anything,
 * not even its own health checks. 0 with *out filled (soft stays as it was when raising is
 * refused), or BATON_EINVAL when the limit cannot be read.
 */
int baton_fd_limit_raise(baton_fd_limit_t *out);

#endif
