/* What this build of the native kernels is: the source hash Python compares before it calls any
 * kernel (a stale library is never used), and a smoke kernel the tests call. */
#include "ember_native.h"

#ifndef EMBER_NATIVE_HASH
#error "build with -DEMBER_NATIVE_HASH=\"...\" (core/native/__init__.py's build() does)"
#endif

/* the tag is also read from the file itself (up_to_date), without loading it */
static const char tag[] __attribute__((used)) = "ember-native-hash:" EMBER_NATIVE_HASH;

EXPORT const char *ember_native_hash(void) { return tag + sizeof "ember-native-hash:" - 1; }

/* y[i] = a * x[i] + y[i] for i < n (the loader's smoke test) */
EXPORT void ember_native_axpy(i64 n, f32 a, const f32 *x, f32 *y) {
  for (i64 i = 0; i < n; i++) y[i] = a * x[i] + y[i];
}
