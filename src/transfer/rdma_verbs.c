/* transfer/rdma_verbs.c — the one place where verbs error conventions become Baton codes. */
#include <errno.h>

#include "transfer/rdma.h"

int baton__rdma_err_errno(int e)
{
    switch (e) {
    case 0:
        return UV_EIO; /* a verb failed without saying why */
    case ENOMEM:
        return BATON_ENOMEM;
    case ENODEV:
    case ENOSYS:
    case ENXIO:
        return BATON_ENODEV;
    case EOPNOTSUPP:
        return BATON_ENOTSUP;
    default:
        return -e; /* libuv's codes are -errno on unix: baton_strerror knows them */
    }
}

int baton__rdma_err_ret(int rc)
{
    if (rc == 0)
        return 0;
    if (rc > 0)
        return baton__rdma_err_errno(rc);
    if (rc == -1 && errno != 0)
        return baton__rdma_err_errno(errno);
    return baton__rdma_err_errno(-rc);
}

int baton__rdma_err_null(void)
{
    return baton__rdma_err_errno(errno);
}

int baton__rdma_err_count(int n)
{
    (void)n;
    return UV_EIO;
}

int baton__rdma_err_wc(enum ibv_wc_status st)
{
    switch (st) {
    case IBV_WC_SUCCESS:
        return 0;
    case IBV_WC_LOC_PROT_ERR:
    case IBV_WC_REM_ACCESS_ERR:
    case IBV_WC_REM_INV_REQ_ERR:
    case IBV_WC_MW_BIND_ERR:
        return BATON_ERKEY;
    default:
        /* retry exceeded, RNR, flush, fatal: the connection is gone */
        return BATON_EPEERDOWN;
    }
}
