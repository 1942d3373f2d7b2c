/* emit.h: assembling code objects from abstract instructions (emit.c).
 *
 * What graph breaks generate (agspeed/_resume_code.py) is written as a list of
 * instructions whose jumps and exception ranges name other instructions by
 * index; emit.c lays them out as real bytecode for the running version.
 */
#ifndef AGS_EMIT_H
#define AGS_EMIT_H

#include "compat.h"

/* template: borrowed code object whose other fields the result keeps.
 * instrs: [(opcode, arg, target index or -1, position or None), ...] with
 *   position (line, end_line, col, end_col), any of them None;
 * handlers: [(start, end, handler, depth, lasti), ...] instruction
 *   indices, end exclusive, sorted by start and not overlapping;
 * fields: dict of code.replace() keywords (co_varnames, co_consts, ...).
 * Returns a new code object, or NULL with an exception set (ValueError for
 * a malformed list). */
PyObject *ags_emit_code(PyObject *template, PyObject *instrs,
                        PyObject *handlers, PyObject *fields);

#endif /* AGS_EMIT_H */
