/* fuzz/fuzz_check.h — the harnesses' invariant check: aborts (a libFuzzer crash) even in release
 * builds, where assert() is compiled out. */
#ifndef BATON_FUZZ_CHECK_H
#define BATON_FUZZ_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#define CHECK(x)                                                                                   \
    do {                                                                                           \
        if (!(x)) {                                                                                \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #x);                  \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

#endif
