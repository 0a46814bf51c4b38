/* registry_fixture.h — a registry holding N workers of one role, for the policy unit tests. */
#ifndef BATON_TEST_REGISTRY_FIXTURE_H
#define BATON_TEST_REGISTRY_FIXTURE_H

#include <stdio.h>
#include <string.h>

#include "router/control/registry.h"

#define N 4

typedef struct {
    baton_registry_t *reg;
    baton_worker_t *w[N];
} fixture_t;

/* Fills *f with N workers http://127.0.0.1:<base_port + i> of `role`. 0 or -1. */
static inline int fixture_fill(fixture_t *f, int base_port, baton_worker_role_t role)
{
    memset(f, 0, sizeof(*f));
    if (baton_registry_create(&f->reg) != 0)
        return -1;
    for (int i = 0; i < N; i++) {
        char url[64];
        snprintf(url, sizeof(url), "http://127.0.0.1:%d", base_port + i);
        baton_worker_spec_t spec;
        baton_worker_spec_init(&spec);
        spec.url = url;
        spec.role = role;
        if (baton_registry_add(f->reg, &spec, &f->w[i], NULL, 0) != 0)
            return -1;
    }
    return 0;
}

static int teardown(void **state)
{
    fixture_t *f = *state;
    baton_workers_unref(f->w, N);
    baton_registry_destroy(f->reg);
    return 0;
}

#endif
