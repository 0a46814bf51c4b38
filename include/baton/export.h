/* baton/export.h — BATON_API, the mark that exports a libbaton function from the shared library. */
#ifndef BATON_EXPORT_H
#define BATON_EXPORT_H

/*
 * libbaton is compiled with -fvisibility=hidden: only declarations marked BATON_API are
 * exported from libbaton.so (a test compares `nm -D` against the public headers). The marking is
 * harmless for users and for the static library.
 */
#if defined(__GNUC__) || defined(__clang__)
#define BATON_API __attribute__((visibility("default")))
#else
#define BATON_API
#endif

#endif
