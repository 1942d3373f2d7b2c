/* frame.h: reading CPython's interpreter frames (frame.c), part of the floor.
 *
 * The floor is compat.h (the version layer), protocol.h (the kinds that
 * cross between C and Python) and this header: csrc/ and guards/ both
 * stand on it, and it includes nothing above it.  frame.c and opcodes.c
 * are the only files that include CPython's internal headers.
 */
#ifndef AGS_FRAME_H
#define AGS_FRAME_H

#include "compat.h"

struct _PyInterpreterFrame;


/* Borrowed: the frame's code object, or NULL if it runs something else. */
PyCodeObject *ags_frame_code(struct _PyInterpreterFrame *frame);

/* Borrowed: the frame's globals and builtins dicts. */
PyObject *ags_frame_globals(struct _PyInterpreterFrame *frame);
PyObject *ags_frame_builtins(struct _PyInterpreterFrame *frame);

/* New reference: a dict {name: value} of the frame's bound local slots
 * (arguments, at entry).  NULL with an exception set on failure. */
PyObject *ags_frame_locals(struct _PyInterpreterFrame *frame);

/* Borrowed: the frame's argument slots, localsplus[0..ags_code_nargs),
 * all bound when the hook sees the frame. */
PyObject *const *ags_frame_args(struct _PyInterpreterFrame *frame);
/* How many argument slots a frame of `code` has (positional, keyword-only,
 * *args, **kwargs): the first names of co_localsplusnames. */
int ags_code_nargs(PyCodeObject *code);

/* The unit of RETURN_VALUE in a return code (bytecode.c: ags_bc_return_code
 * makes it RESUME; RETURN_VALUE), where ags_frame_return points a frame. */
#define AGS_RETURN_UNIT 1

/* 1 if an unstarted frame can be made to return a value: its code has a
 * stack slot and its stack is empty. */
int ags_frame_can_return(struct _PyInterpreterFrame *frame);

/* Makes the unstarted `frame` return `value` (stolen) when it is evaluated,
 * without running its bytecode.  Requires ags_frame_can_return() and
 * `retcode` made from the frame's code by ags_bc_return_code. */
void ags_frame_return(struct _PyInterpreterFrame *frame,
                      PyCodeObject *retcode, PyObject *value);

#endif /* AGS_FRAME_H */
