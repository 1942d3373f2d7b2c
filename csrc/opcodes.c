/* opcodes.c: what the decoder needs to know about each opcode number.
 *
 * Two facts per opcode of the running version, in one table indexed by
 * opcode number:
 *   caches  how many inline CACHE units follow it (CPython's own table,
 *           _PyOpcode_Caches, which is not exported: defining
 *           NEED_OPCODE_TABLES / NEED_OPCODE_METADATA gives this file its
 *           own copy, so it always matches the headers built against);
 *   jump    0, or +1 / -1 for a relative jump forward / backward (the
 *           per-version lists in opcodes_3XX.h).
 *
 * The table is filled once at module init.  It describes base opcodes: the
 * decoder reads PyCode_GetCode(), which holds no specialized or
 * instrumented opcodes.
 */
#include "agspeed.h"

#define Py_BUILD_CORE 1
#if defined(AGS_PY313)
#  define NEED_OPCODE_METADATA
#  include "internal/pycore_opcode_metadata.h"
#else
#  define NEED_OPCODE_TABLES
#  include "internal/pycore_opcode.h"
#endif
#undef Py_BUILD_CORE

ags_opinfo ags_opcodes[256];

void
ags_opcodes_init(void)
{
    for (int op = 0; op < 256; op++) {
        ags_opcodes[op].caches = _PyOpcode_Caches[op];
        ags_opcodes[op].jump = 0;
    }
#define AGS_X(name) ags_opcodes[name].jump = 1;
    AGS_JUMPS_FORWARD(AGS_X)
#undef AGS_X
#define AGS_X(name) ags_opcodes[name].jump = -1;
    AGS_JUMPS_BACKWARD(AGS_X)
#undef AGS_X
}
