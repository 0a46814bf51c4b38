/* common/fd_limit.c — raising the soft descriptor limit to the hard one (router and worker). */
#include "common/fd_limit.h"

#include <sys/resource.h>

#include "baton/error.h"

static uint64_t lim_value(rlim_t v)
{
    return v == RLIM_INFINITY || v > ((rlim_t)1 << 30) ? (uint64_t)1 << 30 : (uint64_t)v;
}

int baton_fd_limit_raise(baton_fd_limit_t *out)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return BATON_EINVAL;
    out->before = lim_value(rl.rlim_cur);
    if (rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
            getrlimit(RLIMIT_NOFILE, &rl);
    }
    out->soft = lim_value(rl.rlim_cur);
    out->hard = lim_value(rl.rlim_max);
    return 0;
}
