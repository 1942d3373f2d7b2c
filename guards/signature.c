/* signature.c: the 64-bit signature hash that keys the code caches.
 *
 * The guard system reduces everything a cached graph assumed about its
 * tensor inputs and the global state (dtype, device, sizes, strides,
 * requires_grad, grad mode, autocast) to a flat byte string and hashes it;
 * a code's cache maps that hash to its entries, so many shapes of one
 * function cost one lookup.  The hash is XXH3-64 from the system xxHash
 * library (Debian libxxhash-dev): fast on short inputs, stable across
 * processes and machines for a given seed, which the persistent cache
 * needs.
 *
 * Stable API: ags_signature_hash().  Python sees it as
 * agspeed._C.signature_hash(data, seed=0), for tests and for keys built in
 * Python.
 */
#include "agspeed.h"

#include <xxhash.h>

uint64_t
ags_signature_hash(const void *data, size_t len, uint64_t seed)
{
    return (uint64_t)XXH3_64bits_withSeed(data, len, (XXH64_hash_t)seed);
}
