/* version.c — the version of the library that is loaded.
 *
 * CGT_VERSION_STRING in cgtree.h is the version of the header a program was
 * compiled against; cgt_version() is the version of the libcgtree that runs.
 * Meson passes the project version (meson.build) as CGT_PROJECT_VERSION, so a
 * test that compares the two catches a header and a build that disagree.
 */
#include "cgtree.h"

#ifndef CGT_PROJECT_VERSION
#error "CGT_PROJECT_VERSION must be defined by the build (lib/meson.build)"
#endif

const char *cgt_version(void) { return CGT_PROJECT_VERSION; }
