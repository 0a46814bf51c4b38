/* config_int.h — what config.c (the option table, the file, the command line) and
 * config_workers.c (the worker list) share. */
#ifndef BATON_ROUTER_CONFIG_INT_H
#define BATON_ROUTER_CONFIG_INT_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "router/control/config.h"

/* printf into err (when given) and returns rc. */
int baton__config_err(char *err, size_t errlen, int rc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* A plain decimal (no sign, no space): 0 or BATON_EINVAL. */
int baton__config_parse_u64(const char *s, uint64_t *v_p);
/* "--name=value" or "--name value" (advancing *i): the value, or NULL when missing. */
const char *baton__config_flag_value(int argc, char *const argv[], int *i, const char *arg,
                                     size_t name_len);

/* One element of the JSON file's "workers" array (`where` names it in errors). */
int baton__config_json_worker(baton_config_t *cfg, json_t *jw, const char *where, char *err,
                              size_t errlen);
/* --prefill URL [BOOTSTRAP_PORT], --decode URL, --worker URL at argv[*i]; a worker of the same
 * URL among the first replace_below (the file's) is replaced; *index_p: where it went. */
int baton__config_cli_worker(baton_config_t *cfg, baton_worker_role_t role, int argc,
                             char *const argv[], int *i, const char *flag, size_t replace_below,
                             long *index_p, char *err, size_t errlen);

#endif
