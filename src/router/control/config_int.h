/* config_int.h — what config.c (the option table, the file, the command line),
 * config_workers.c (the worker list) and config_help.c (--help) share. */
#ifndef BATON_ROUTER_CONFIG_INT_H
#define BATON_ROUTER_CONFIG_INT_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "router/control/config.h"

/* One option: its flag, its JSON place, its field and bounds (config.c's table). */
typedef enum {
    OPT_STR,      /* char * */
    OPT_INT,      /* int */
    OPT_UINT,     /* unsigned */
    OPT_SIZE,     /* size_t */
    OPT_U64,      /* uint64_t */
    OPT_POLICY,   /* baton_policy_kind_t */
    OPT_LOGLEVEL, /* baton_log_level_t */
    OPT_STRLIST,  /* baton_config_strlist_t: repeatable flag, JSON string or array of strings */
    OPT_BOOL,     /* int 0/1: a bare flag (or --flag=true|false), JSON true/false */
    OPT_RATE,     /* char *: "RPS[:BURST]", checked when set */
    OPT_MODELMAP, /* baton_config_strlist_t of "[MODEL=]VALUE": a repeatable flag; in JSON a
                     value, an array of "[MODEL=]VALUE" strings, or {"MODEL": VALUE, ...} */
} opt_type_t;

typedef struct {
    const char *flag;    /* "--max-body-bytes" */
    const char *section; /* JSON object holding the key: NULL (top level), "limits", "timeouts" */
    const char *key;     /* "max_body_bytes" */
    opt_type_t type;
    size_t offset;
    uint64_t min, max;
    unsigned set_flag;
    const char *metavar;
    const char *help;
} baton__opt_t;

/* The table, in config.c. */
extern const baton__opt_t *const baton__config_options;
extern const size_t baton__config_n_options;

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
