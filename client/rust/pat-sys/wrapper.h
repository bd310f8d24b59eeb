/* What bindgen.sh generates bindings.rs from: libpat's API and the errno values it returns. */
#include <errno.h>

#include "pat.h"
