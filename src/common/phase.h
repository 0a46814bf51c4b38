/* phase.h — the one phase-machine helper: a table of phase names and legal moves, one checked
 * move, and the count of refused (illegal) moves that tests assert to be zero. */
#ifndef BATON_COMMON_PHASE_H
#define BATON_COMMON_PHASE_H

#include <stdint.h>

#include "baton/error.h"

/*
 * Every state machine in Baton (a proxied request, a worker job and its sequences, a KV room on
 * either side, a transfer connection) is one enum, one table built with designated initialisers
 * (so a reordered enum cannot shift a name or a move onto the wrong phase), and one function that
 * moves: a move the table does not list is refused, logged with the machine's context, counted,
 * and leaves the phase unchanged. A refused move is a bug; the count is process-wide (atomic:
 * tables are shared by every loop thread) and tests assert it stays zero.
 *
 *   enum { ST_A, ST_B, ST_N };
 *   static const uint32_t legal[ST_N] = {[ST_A] = BATON_PHASE_BIT(ST_B)};
 *   static const char *const names[ST_N] = {[ST_A] = "a", [ST_B] = "b"};
 *   const baton_phase_table_t tab = {"comp", "thing", ST_N, legal, names};
 *   ...
 *   if (BATON_PHASE_MOVE(&tab, x->state, ST_B, "id=%s", x->id) != 0) return;
 *
 * At most 32 phases per table. Phases are unsigned; `from` or `to` >= n is never legal.
 */
typedef struct baton_phase_table_s {
    const char *comp;         /* the log component of a refused move's line */
    const char *what;         /* its subject: the line is "<what>_bad_transition" */
    unsigned n;               /* phases are 0 .. n-1 */
    const uint32_t *legal;    /* legal[from]: bit `to` set when from -> to is allowed */
    const char *const *names; /* names[phase]; a missing one reads "?" */
} baton_phase_table_t;

#define BATON_PHASE_BIT(p) (UINT32_C(1) << (p))

/* 1 when from -> to is in the table, else 0. */
static inline int baton_phase_legal(const baton_phase_table_t *t, unsigned from, unsigned to)
{
    return from < t->n && to < t->n && ((t->legal[from] >> to) & 1u) != 0;
}

/* The phase's name, or "?" when out of range or unnamed. */
const char *baton_phase_name(const baton_phase_table_t *t, unsigned p);

/* Refuses from -> to (the table does not list it, or the machine's own invariant forbids it):
 * counts the refusal, logs "<what>_bad_transition from=.. to=.. <context>" (context
 * printf-style, may be NULL) at error level and returns BATON_EINVAL. The caller leaves its
 * phase as it is. */
int baton_phase_refuse(const baton_phase_table_t *t, unsigned from, unsigned to, const char *fmt,
                       ...) __attribute__((format(printf, 4, 5)));

/* The checked move: sets the lvalue `field` to `to` when the table allows it (0), else
 * refuses (BATON_EINVAL, field unchanged). The context arguments are evaluated only on a refusal.
 */
#define BATON_PHASE_MOVE(t, field, to, ...)                                                        \
    (baton_phase_legal((t), (unsigned)(field), (unsigned)(to))                                     \
         ? ((field) = (to), 0)                                                                     \
         : baton_phase_refuse((t), (unsigned)(field), (unsigned)(to), __VA_ARGS__))

/* Illegal moves refused in this process since it started (or since the last reset). */
uint64_t baton_phase_refused(void);
/* Tests only: sets the count back to zero. */
void baton_phase_refused_reset(void);

#endif
