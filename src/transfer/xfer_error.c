/* transfer/xfer_error.c — messages and names for libbaton's public error table and its version. */
#include "baton/transfer.h"

const char *baton_xfer_strerror(int err)
{
    switch (err) {
    case 0:
        return "success";
#define XX(name, value, msg)                                                                       \
    case value:                                                                                    \
        return msg;
        BATON_XFER_ERRNO_MAP(XX)
#undef XX
    default:
        return uv_strerror(err); /* libuv / errno codes pass through */
    }
}

const char *baton_xfer_err_name(int err)
{
    switch (err) {
    case 0:
        return "OK";
#define XX(name, value, msg)                                                                       \
    case value:                                                                                    \
        return "BATON_XFER_" #name;
        BATON_XFER_ERRNO_MAP(XX)
#undef XX
    default:
        return uv_err_name(err);
    }
}

unsigned baton_version(void)
{
    return BATON_VERSION_HEX;
}

const char *baton_version_string(void)
{
    return BATON_VERSION_STRING;
}
