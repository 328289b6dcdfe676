// The runner's version, printed by ./run --version and ./export --version.
#ifndef VERSION_H
#define VERSION_H

#define PKV_VERSION "0.4.0"

// The commit the build came from, "-dirty" when the tree had changes (the Makefile writes
// commit.h into the build directory; a build without it says "unknown").
#if defined(__has_include)
#if __has_include("commit.h")
#include "commit.h"
#endif
#endif
#ifndef PKV_COMMIT
#define PKV_COMMIT "unknown"
#endif

#endif
