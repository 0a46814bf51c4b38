/* help_check.h — for the router config tests: fails unless baton's --help names every string. */
#ifndef BATON_TEST_ROUTER_HELP_CHECK_H
#define BATON_TEST_ROUTER_HELP_CHECK_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "router/control/config.h"

/* Prints the router's --help into memory and fails the test on the first of want[0..n) it lacks. */
static void assert_help_lists(const char *const *want, size_t n)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    baton_config_print_help(f, "baton");
    fclose(f);
    for (size_t i = 0; i < n; i++)
        if (strstr(buf, want[i]) == NULL)
            fail_msg("--help lacks %s", want[i]);
    free(buf);
}

#endif
