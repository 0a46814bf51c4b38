/* store/main.c — the baton-store program: one binary, its first argument picks the role (master,
 * node) or the operator's command (put, get, exists, rm, stat). */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "common/log.h"
#include "store/master.h"

int baton__node_main(int argc, char **argv);
int baton__cli_main(const char *cmd, int argc, char **argv);
int baton__bench_main(int argc, char **argv);

int main(int argc, char **argv)
{
    const char *cmd = argc > 1 ? argv[1] : "";
    /* A peer gone mid-write (a client that exited, a master that stopped) is an error code on
     * that connection, never the end of a master or a node. */
    signal(SIGPIPE, SIG_IGN);
    if (strcmp(cmd, "master") == 0)
        return baton__master_main(argc - 1, argv + 1);
    if (strcmp(cmd, "node") == 0)
        return baton__node_main(argc - 1, argv + 1);
    if (strcmp(cmd, "put") == 0 || strcmp(cmd, "get") == 0 || strcmp(cmd, "exists") == 0 ||
        strcmp(cmd, "rm") == 0 || strcmp(cmd, "stat") == 0)
        return baton__cli_main(cmd, argc - 1, argv + 1);
    if (strcmp(cmd, "bench") == 0)
        return baton__bench_main(argc - 1, argv + 1);
    fprintf(stderr,
            "usage: baton-store master|node|put|get|exists|rm|stat|bench ... (--help for each)\n");
    return strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 ? 0 : 2;
}
