/* error.c — messages and names for the project-wide error enum (include/baton/error.h). */
#include "baton/error.h"

#include <uv.h>

const char *baton_strerror(int err)
{
    switch (err) {
    case 0:
        return "success";
#define XX(name, value, msg)                                                                       \
    case value:                                                                                    \
        return msg;
        BATON_ERRNO_MAP(XX)
#undef XX
    default:
        return uv_strerror(err);
    }
}

const char *baton_err_name(int err)
{
    switch (err) {
    case 0:
        return "OK";
#define XX(name, value, msg)                                                                       \
    case value:                                                                                    \
        return "BATON_" #name;
        BATON_ERRNO_MAP(XX)
#undef XX
    default:
        return uv_err_name(err);
    }
}
