/* probe.c — the layering probe: includes the one header named by BATON_PROBE_HEADER, compiled
 * with the include roots of the target it links (tests/layering/CMakeLists.txt). */
#include BATON_PROBE_HEADER

/* Something to compile besides the header, so the object is never empty. */
int baton_layering_probe(void);
int baton_layering_probe(void)
{
    return 0;
}
