/* phase.c — the checked phase move's refusal path: the log line and the process-wide count. */
#include "common/phase.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>

#include "common/log.h"

static _Atomic uint64_t refused;

const char *baton_phase_name(const baton_phase_table_t *t, unsigned p)
{
    return p < t->n && t->names[p] ? t->names[p] : "?";
}

int baton_phase_refuse(const baton_phase_table_t *t, unsigned from, unsigned to, const char *fmt,
                       ...)
{
    atomic_fetch_add_explicit(&refused, 1, memory_order_relaxed);
    char ctx[256] = "";
    if (fmt) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(ctx, sizeof(ctx), fmt, ap);
        va_end(ap);
    }
    log_error(t->comp, "%s_bad_transition from=%s to=%s %s", t->what, baton_phase_name(t, from),
              baton_phase_name(t, to), ctx);
    return BATON_EINVAL;
}

uint64_t baton_phase_refused(void)
{
    return atomic_load_explicit(&refused, memory_order_relaxed);
}

void baton_phase_refused_reset(void)
{
    atomic_store_explicit(&refused, 0, memory_order_relaxed);
}
