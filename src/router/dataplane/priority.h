/* priority.h — a request's priority class: its names, where it comes from (the x-priority
 * header, the body's vLLM-style priority field, the API key's default), who may claim system,
 * its share of the admission queue and the integer vLLM's priority scheduler is given. */
#ifndef BATON_ROUTER_PRIORITY_H
#define BATON_ROUTER_PRIORITY_H

#include <stddef.h>

#include "common/json_scan.h"

/*
 * Four classes, in admission order: a waiting request of a higher class is always admitted
 * before one of a lower class (strict priority; FIFO within a class). Plain data and pure
 * functions: no state, callable from every thread.
 *
 * Where a request's class comes from, first match wins:
 *   1. the header `x-priority: bulk|default|interactive|system` (names case-insensitive);
 *   2. the body's `priority` field, an integer with vLLM's sense (lower runs earlier):
 *      < 0 interactive, 0 default, > 0 bulk (an integer never claims system); null = absent;
 *   3. the API key's default class (`KEY priority=CLASS` in the key file, or --api-key);
 *   4. default.
 * `system` is reserved: only a request whose API key has the class system may carry it (by
 * header or as the key's default); a claim by anyone else is 403 priority_not_allowed.
 */
typedef enum {
    BATON_PRIO_BULK = 0,
    BATON_PRIO_DEFAULT,
    BATON_PRIO_INTERACTIVE,
    BATON_PRIO_SYSTEM,
    BATON_PRIO_COUNT,
} baton_prio_t;

#define BATON_PRIO_NONE (-1) /* "no class given" where an int carries an optional class */

/* "bulk", "default", "interactive", "system". */
const char *baton_prio_name(baton_prio_t p);

/* The class named s[0..len) (case-insensitive) into *out: 0, or BATON_EINVAL. */
int baton_prio_parse(const char *s, size_t len, baton_prio_t *out);

/* The integer sent as vLLM's `priority` (lower = scheduled earlier): bulk 1, default 0,
 * interactive -1, system -2. Default is 0, so a vLLM without priority scheduling still takes it. */
int baton_prio_vllm_value(baton_prio_t p);

/*
 * How full the admission queue (all classes together) may be for a class to join it, in
 * percent of --queue-size: bulk 50, default 100, interactive 125, system 150. A request that
 * finds the queue that full is shed (429). So --queue-size is what default traffic may fill,
 * as without classes; bulk is refused first, from half of it, and interactive and system keep
 * a reserve beyond it. The limit is the share rounded down, at least 1 (0 with no queue).
 */
unsigned baton_prio_queue_share_pct(baton_prio_t p);
unsigned baton_prio_queue_limit(baton_prio_t p, unsigned queue_size);

/*
 * How many requests may be proxied at once (all classes together) for a class to take a slot:
 * bulk and default up to --max-concurrent-requests, interactive reserve_pct percent beyond it
 * and system twice that (each at least one beyond when reserve_pct > 0; --priority-reserve-pct,
 * default 50). The reserve is what keeps interactive latency flat under a flood of lower
 * classes: a freed slot goes to the highest class waiting, but an interactive request arriving
 * while bulk fills every slot need not wait for one to free. 0 = unlimited.
 */
#define BATON_PRIO_RESERVE_PCT 50
unsigned baton_prio_slot_limit(baton_prio_t p, unsigned max_active, unsigned reserve_pct);

/* Why a class could not be decided: status 400 (bad name or type) or 403 (system claimed). */
typedef struct {
    int status;
    const char *code;  /* "invalid_priority", "invalid_type", "priority_not_allowed" */
    const char *param; /* "x-priority" or "priority" */
    char message[200];
} baton_prio_error_t;

/*
 * Decides the class by the rules above. header: the x-priority value (NULL when absent);
 * field: the body's top-level `priority` (NULL when absent); key_class: the API key's class
 * (BATON_PRIO_NONE when the request has no key or its key none). 0 with *out set, or
 * BATON_EINVAL with *err filled.
 */
int baton_prio_resolve(const char *header, const baton_json_val_t *field, int key_class,
                       baton_prio_t *out, baton_prio_error_t *err);

#endif
