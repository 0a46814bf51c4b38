/* pick.c — worker selection for one upstream request: eligibility, health admission, per-worker
 * caps (reserved with a CAS), avoiding failed workers. */
#include "router/pick.h"

#define PICK_STACK 64

/* Takes one in-flight slot on w if it is under cap (0 = no cap). */
static int reserve(baton_worker_t *w, unsigned cap)
{
    long cur = atomic_load(&w->in_flight);
    do {
        if (cap && cur >= (long)cap)
            return 0;
    } while (!atomic_compare_exchange_weak(&w->in_flight, &cur, cur + 1));
    return 1;
}

void baton_pick_release(baton_whealth_t *health, baton_pick_t *p, baton_breaker_outcome_t outcome)
{
    if (!p->w)
        return;
    if (health && p->ticket)
        baton_whealth_done(health, p->w, p->ticket, outcome);
    baton_worker_in_flight_dec(p->w);
    baton_worker_unref(p->w);
    p->w = NULL;
    p->ticket = 0;
}

baton_pick_rc_t baton_pick(baton_registry_t *reg, baton_policy_t *policy, baton_whealth_t *health,
                           unsigned cap, baton_worker_role_t role, baton_worker_t *const *avoid,
                           size_t n_avoid, baton_pick_t *out)
{
    return baton_pick_if(reg, policy, health, cap, role, avoid, n_avoid, NULL, NULL, out);
}

baton_pick_rc_t baton_pick_if(baton_registry_t *reg, baton_policy_t *policy,
                              baton_whealth_t *health, unsigned cap, baton_worker_role_t role,
                              baton_worker_t *const *avoid, size_t n_avoid, baton_pick_keep_cb keep,
                              const void *keep_arg, baton_pick_t *out)
{
    baton_worker_t *stack[PICK_STACK], **cands;
    size_t n =
        baton_registry_snapshot_all(reg, role, BATON_SNAP_ELIGIBLE, stack, PICK_STACK, &cands);
    int capped = 0;
    out->w = NULL;
    out->ticket = 0;

    /* Candidates under the cap; those not avoided first. */
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (keep && !keep(cands[i], keep_arg)) {
            baton_worker_unref(cands[i]);
        } else if (cap && baton_worker_in_flight(cands[i]) >= (long)cap) {
            capped = 1;
            baton_worker_unref(cands[i]);
        } else {
            cands[k++] = cands[i];
        }
    }
    size_t fresh = 0; /* cands[0..fresh) are not avoided */
    for (size_t i = 0; i < k; i++) {
        if (!baton_workers_contain(avoid, n_avoid, cands[i])) {
            baton_worker_t *t = cands[fresh];
            cands[fresh++] = cands[i];
            cands[i] = t;
        }
    }
    while (k > 0) {
        size_t m = fresh ? fresh : k;
        baton_worker_t *c = baton_policy_select(policy, cands, m);
        if (!c)
            break;
        baton_whealth_ticket_t t = 0;
        int ok = !health || baton_whealth_admit(health, c, &t);
        if (ok && !reserve(c, cap)) {
            if (health && t)
                baton_whealth_done(health, c, t, BATON_OUTCOME_NEUTRAL);
            capped = 1;
            ok = 0;
        }
        if (ok) {
            baton_worker_ref(c);
            out->w = c;
            out->ticket = t;
            break;
        }
        /* Refused (probe slot taken, or raced to its cap): choose among the others, keeping
         * the not-avoided ones in front. */
        size_t idx = 0;
        while (cands[idx] != c)
            idx++;
        baton_worker_unref(c);
        if (idx < fresh) {
            cands[idx] = cands[fresh - 1];
            cands[fresh - 1] = cands[k - 1];
            fresh--;
        } else {
            cands[idx] = cands[k - 1];
        }
        k--;
    }
    baton_workers_release(cands, k, stack);
    if (out->w)
        return BATON_PICK_OK;
    return capped ? BATON_PICK_CAPPED : BATON_PICK_NONE;
}
