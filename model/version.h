// The runner's version, printed by ./run --version and ./export --version.
#ifndef VERSION_H
#define VERSION_H

#define PKV_VERSION "0.4.0"

#endif
