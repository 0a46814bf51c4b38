/* pick.c — worker selection for one upstream request: eligibility, health admission, per-worker
 * caps (reserved with a CAS), avoiding failed workers. */
#include "router/dataplane/pick.h"

#include <string.h>

#include "router/control/worker_models.h"

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
    baton_pick_unreserve(p->w, p->tokens);
    baton_worker_unref(p->w);
    p->w = NULL;
    p->ticket = 0;
    p->tokens = 0;
}

void baton_pick_unreserve(baton_worker_t *w, uint32_t tokens)
{
    baton_worker_in_flight_dec(w);
    if (tokens)
        atomic_fetch_sub(&w->in_flight_tokens, (long)tokens);
}

/* The id of the pin list that names a worker of `role`, copied into id; 0 when none does. */
static int pin_for_role(baton_registry_t *reg, const char *pin, baton_worker_role_t role,
                        char id[BATON_WORKER_ID_MAX])
{
    while (pin && *pin) {
        const char *end = strchr(pin, ',');
        size_t len = end ? (size_t)(end - pin) : strlen(pin);
        while (len && pin[0] == ' ')
            pin++, len--;
        while (len && pin[len - 1] == ' ')
            len--;
        if (len && len < BATON_WORKER_ID_MAX) {
            memcpy(id, pin, len);
            id[len] = '\0';
            baton_worker_t *w = baton_registry_get(reg, id);
            int hit = w && w->role == role;
            baton_worker_unref(w);
            if (hit)
                return 1;
        }
        pin = end ? end + 1 : NULL;
    }
    return 0;
}

baton_pick_rc_t baton_pick(baton_registry_t *reg, baton_policy_t *policy, baton_whealth_t *health,
                           unsigned cap, baton_worker_role_t role, baton_worker_t *const *avoid,
                           size_t n_avoid, baton_pick_t *out)
{
    return baton_pick_ctx(reg, policy, health, cap, role, avoid, n_avoid, NULL, NULL, NULL, out);
}

baton_pick_rc_t baton_pick_ctx(baton_registry_t *reg, baton_policy_t *policy,
                               baton_whealth_t *health, unsigned cap, baton_worker_role_t role,
                               baton_worker_t *const *avoid, size_t n_avoid,
                               baton_pick_keep_cb keep, const void *keep_arg,
                               baton_route_ctx_t *ctx, baton_pick_t *out)
{
    baton_worker_t *stack[PICK_STACK], **cands;
    size_t n =
        baton_registry_snapshot_all(reg, role, BATON_SNAP_ELIGIBLE, stack, PICK_STACK, &cands);
    int capped = 0;
    char pin[BATON_WORKER_ID_MAX];
    int pinned = ctx && pin_for_role(reg, ctx->pin, role, pin);
    out->w = NULL;
    out->ticket = 0;
    out->tokens = 0;
    if (pinned) {
        /* Only the pinned worker is a candidate; avoid[] does not apply (debugging wants it). */
        size_t kept = 0;
        for (size_t i = 0; i < n; i++) {
            if (strcmp(cands[i]->id, pin) == 0)
                cands[kept++] = cands[i];
            else
                baton_worker_unref(cands[i]);
        }
        n = kept;
        n_avoid = 0;
    }

    /* Candidates under the cap; those not avoided first. */
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if ((keep && !keep(cands[i], keep_arg)) ||
            (ctx && ctx->model_pool &&
             !baton_worker_in_pool(cands[i], (baton_model_pool_t)ctx->model_pool, ctx->model))) {
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
        baton_choice_t why = BATON_CHOICE_PIN;
        uint32_t matched = 0;
        baton_worker_t *c =
            pinned ? cands[0] : baton_policy_select_ctx(policy, cands, m, ctx, &why, &matched);
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
            uint32_t load = baton_policy_prompt_load(policy, ctx);
            if (load) {
                out->tokens = load;
                atomic_fetch_add(&c->in_flight_tokens, (long)load);
            }
            baton_policy_chosen(policy, c, ctx, why, matched);
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
