/* bytecode.h: opcodes per version (opcodes.c) and decoded bytecode
 * (bytecode.c): what the interpreter and code generation read code through.
 *
 * The opcode numbers come from CPython's opcode.h; the jump lists and the
 * interpreter's handler rows of each version from csrc/opcodes_3XX.h,
 * selected here on compat.h's version names.
 */
#ifndef AGS_BYTECODE_H
#define AGS_BYTECODE_H

#include "compat.h"
#include <stdint.h>
#include <opcode.h>
#include "opcodes_common.h"
#if defined(AGS_PY311)
#  include "opcodes_311.h"
#elif defined(AGS_PY312)
#  include "opcodes_312.h"
#else
#  include "opcodes_313.h"
#endif


typedef struct {
    uint8_t caches;     /* inline CACHE units after the instruction */
    int8_t jump;        /* 0, or +1/-1: relative jump forward/backward */
} ags_opinfo;

extern ags_opinfo ags_opcodes[256];
void ags_opcodes_init(void);

typedef struct {
    int start;          /* offset of the first EXTENDED_ARG prefix */
    int offset;         /* offset of the opcode */
    int next;           /* offset after the inline caches */
    int target;         /* jump target offset, or -1 */
    uint32_t arg;       /* the full argument, prefixes folded in */
    uint8_t opcode;
} ags_instr;

typedef struct {
    Py_ssize_t n;
    ags_instr *instrs;  /* n instructions in bytecode order */
    int *index;         /* start offset / 2 -> instruction index, or -1 */
    Py_ssize_t n_units; /* entries of `index`: the code's 16-bit units */
} ags_bytecode;

/* Decodes `code` into `bc` (which the caller releases with
 * ags_bc_release).  Returns 0, or -1 with ValueError for malformed
 * bytecode (or MemoryError). */
int ags_bc_decode(PyCodeObject *code, ags_bytecode *bc);
void ags_bc_release(ags_bytecode *bc);

/* New reference: [(start, offset, opcode, arg, target, next), ...]. */
PyObject *ags_bc_to_list(PyCodeObject *code);

/* New reference: the "return code" of `code` (same locals layout, bytecode
 * RESUME; RETURN_VALUE, one stack slot): what a frame whose result is known
 * runs instead (frame.h: ags_frame_return).  NULL with an exception set. */
PyObject *ags_bc_return_code(PyCodeObject *code);

/* One entry of an exception table, in byte offsets. */
typedef struct {
    int start, end;     /* the instructions it covers: [start, end) */
    int handler;        /* where the handler starts */
    int depth;          /* stack depth the handler starts at */
    int lasti;          /* the handler also gets the raising offset */
} ags_except;

/* Decodes `code`'s exception table into *out (PyMem, released by the
 * caller; NULL when empty).  0, or -1 with ValueError when truncated. */
int ags_bc_exceptions(PyCodeObject *code, ags_except **out, Py_ssize_t *n);


/* New reference: [(start, end, handler, depth, lasti), ...]. */
PyObject *ags_bc_exceptions_list(PyCodeObject *code);

#endif /* AGS_BYTECODE_H */
