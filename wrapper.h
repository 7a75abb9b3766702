/* The one header criu-plugin-sys generates bindings from: CRIU's own plugin ABI.
 * Install it with `apt-get install libcriu-dev` (CRIU 4.x, Debian trixie or newer) or point
 * CRIU_INCLUDE_DIR at a directory holding criu/criu-plugin.h. */
#include <criu/criu-plugin.h>
