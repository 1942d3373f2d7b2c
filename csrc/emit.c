/* emit.c: a bytecode assembler for the code a graph break generates.
 *
 * Graph breaks that resume.  When capture stops at an instruction it cannot
 * model, the frame is not given up: the graph made so far is compiled, and
 * two code objects are generated (agspeed/_resume_code.py decides what
 * they hold; this file only lays them out):
 *
 *   the break code   called with the frame's live values (the graph's
 *                    outputs, constants, the frame's own locals), it
 *                    pushes the Python stack as it was at the break, runs
 *                    the break instruction for real (a call, a branch on a
 *                    tensor, ...) and calls the resume function of the
 *                    path taken with the new stack and the locals.  The
 *                    hook never captures it (it is marked skip);
 *   the resume function   the original code whole, behind a prologue that
 *                    pushes the stack back and jumps to the instruction
 *                    after the break.  Its file, name and lines are the
 *                    user's, so the hook captures it like any user code
 *                    (its own graph, guards and cache entries) and
 *                    tracebacks through it name the user's lines.
 *
 * Both are written by Python as lists of abstract instructions: (opcode,
 * arg, target, position), a jump naming its target by index in the list,
 * exception ranges naming instructions by index too.  ags_emit_code turns
 * such a list into a real code object for the running CPython:
 *
 *   layout      each instruction takes its EXTENDED_ARG prefixes, itself
 *               and its inline CACHE units (zeroed; CPython's own cache
 *               table, bytecode.c's ags_opcodes).  Jump arguments depend
 *               on the layout and the layout on the arguments' widths, so
 *               sizes are recomputed until none grows (they never shrink,
 *               so this ends).  A relative jump whose target lies on the
 *               other side takes its twin (JUMP_FORWARD <-> JUMP_BACKWARD,
 *               3.11's POP_JUMP_FORWARD/BACKWARD pairs: the version's
 *               AGS_JUMP_TWINS table); one with no twin is a ValueError;
 *   lines       co_linetable in the 3.11+ format, one entry per (at most
 *               8) code units: the long form (line, end line, columns)
 *               for an instruction with columns, the "no column" form for
 *               one with a line only, "no location" otherwise.  Prefixes
 *               and caches share their instruction's position, as the
 *               compiler's own tables do;
 *   handlers    co_exceptiontable entries (start, length, target, depth
 *               and lasti), varints of 6-bit groups, most significant
 *               first, bit 0x80 on an entry's first byte;
 *   stack       co_stacksize by walking the control flow from the first
 *               instruction with CPython's PyCompile_OpcodeStackEffect-
 *               WithJump (handlers start at depth + lasti + 1).  Code no
 *               path reaches costs nothing.
 *
 * The rest of the code object (names, constants, locals, flags, qualname,
 * file) is the template's, with the caller's replacements, through
 * code.replace(): the one constructor whose signature every supported
 * version shares.
 *
 * Rejected: generating Python source and compiling it (the break
 * instruction's exact semantics and the user's line numbers would be
 * lost); a general-purpose bytecode library (a dependency, and it would
 * still need the per-version tables this project keeps in opcodes_3XX.h).
 */
#include "agspeed.h"
#include "emit.h"
#include <string.h>

typedef struct {
    int op;
    uint32_t arg;
    Py_ssize_t target;      /* instruction index, or -1 */
    int line, end_line;     /* -1: none */
    int col, end_col;       /* -1: none */
    int start;              /* in code units, prefixes included */
    int size;               /* units: prefixes, opcode, caches */
} emit_ins;

typedef struct {
    Py_ssize_t start, end, handler;
    int depth, lasti;
} emit_handler;

/* A growable byte buffer. */
typedef struct {
    unsigned char *p;
    Py_ssize_t n, cap;
} emit_buf;

static int
buf_put(emit_buf *b, unsigned char c)
{
    if (b->n == b->cap) {
        Py_ssize_t cap = b->cap ? b->cap * 2 : 64;
        unsigned char *p = PyMem_Realloc(b->p, (size_t)cap);

        if (p == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        b->p = p;
        b->cap = cap;
    }
    b->p[b->n++] = c;
    return 0;
}

static int
twin_of(int op)
{
#define AGS_X(fwd, back) \
    if (op == (fwd)) { \
        return (back); \
    } \
    if (op == (back)) { \
        return (fwd); \
    }
    AGS_JUMP_TWINS(AGS_X)
#undef AGS_X
    return -1;
}

static int
is_stop(int op)
{
#define AGS_X(name) \
    if (op == (name)) { \
        return 1; \
    }
    AGS_EMIT_STOPS(AGS_X)
#undef AGS_X
    return 0;
}

static int
prefixes(uint32_t arg)
{
    return arg > 0xffffff ? 3 : arg > 0xffff ? 2 : arg > 0xff ? 1 : 0;
}

/* An int field of a position, or -1 for None. */
static int
pos_field(PyObject *pos, Py_ssize_t i, int *out)
{
    PyObject *v = PyTuple_GET_ITEM(pos, i);

    if (v == Py_None) {
        *out = -1;
        return 0;
    }
    long x = PyLong_AsLong(v);

    if (x == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (x < -1 || x > INT_MAX) {
        PyErr_SetString(PyExc_ValueError, "emit: position out of range");
        return -1;
    }
    *out = (int)x;
    return 0;
}

static int
parse_instrs(PyObject *list, emit_ins **out, Py_ssize_t *n)
{
    Py_ssize_t count;
    emit_ins *ins;

    if (!PyList_Check(list)) {
        PyErr_SetString(PyExc_TypeError, "emit: instructions must be a list");
        return -1;
    }
    count = PyList_GET_SIZE(list);
    ins = PyMem_Calloc((size_t)count + 1, sizeof(emit_ins));
    if (ins == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    *out = ins;
    *n = count;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *t = PyList_GET_ITEM(list, i), *pos;
        long op, arg;
        Py_ssize_t target;

        if (!PyArg_ParseTuple(t, "llnO;emit: (opcode, arg, target, position)",
                              &op, &arg, &target, &pos)) {
            return -1;
        }
        if (op <= 0 || op > 255 || arg < 0 || arg > 0x7fffffffL
            || target < -1 || target >= count) {
            PyErr_Format(PyExc_ValueError, "emit: bad instruction %zd: %R",
                         i, t);
            return -1;
        }
        ins[i].op = (int)op;
        ins[i].arg = (uint32_t)arg;
        ins[i].target = target;
        ins[i].line = ins[i].end_line = ins[i].col = ins[i].end_col = -1;
        if (pos != Py_None) {
            if (!PyTuple_Check(pos) || PyTuple_GET_SIZE(pos) != 4) {
                PyErr_SetString(PyExc_ValueError, "emit: a position is "
                                "(line, end_line, col, end_col) or None");
                return -1;
            }
            if (pos_field(pos, 0, &ins[i].line) < 0
                || pos_field(pos, 1, &ins[i].end_line) < 0
                || pos_field(pos, 2, &ins[i].col) < 0
                || pos_field(pos, 3, &ins[i].end_col) < 0) {
                return -1;
            }
        }
        if ((target >= 0) != (ags_opcodes[op].jump != 0)) {
            PyErr_Format(PyExc_ValueError, "emit: instruction %zd: only "
                         "relative jumps have a target", i);
            return -1;
        }
    }
    return 0;
}

static int
parse_handlers(PyObject *list, Py_ssize_t n_ins, emit_handler **out,
               Py_ssize_t *n)
{
    Py_ssize_t count;
    emit_handler *h;

    if (!PyList_Check(list)) {
        PyErr_SetString(PyExc_TypeError, "emit: handlers must be a list");
        return -1;
    }
    count = PyList_GET_SIZE(list);
    h = PyMem_Calloc((size_t)count + 1, sizeof(emit_handler));
    if (h == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    *out = h;
    *n = count;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *t = PyList_GET_ITEM(list, i);

        if (!PyArg_ParseTuple(t, "nnnii;emit: (start, end, handler, depth, "
                              "lasti)", &h[i].start, &h[i].end,
                              &h[i].handler, &h[i].depth, &h[i].lasti)) {
            return -1;
        }
        if (h[i].start < 0 || h[i].end <= h[i].start || h[i].end > n_ins
            || h[i].handler < 0 || h[i].handler >= n_ins || h[i].depth < 0
            || (i > 0 && h[i].start < h[i - 1].end)) {
            PyErr_Format(PyExc_ValueError, "emit: bad handler %zd: %R "
                         "(ranges sorted, not overlapping)", i, t);
            return -1;
        }
    }
    return 0;
}

/* Sets each instruction's start, size and jump argument (and direction),
 * repeating until no size grows. */
static int
layout(emit_ins *ins, Py_ssize_t n, int *total)
{
    int changed = 1;

    for (Py_ssize_t i = 0; i < n; i++) {
        ins[i].size = 1 + ags_opcodes[ins[i].op].caches
                      + (ins[i].target >= 0 ? 0 : prefixes(ins[i].arg));
    }
    while (changed) {
        int at = 0;

        changed = 0;
        for (Py_ssize_t i = 0; i < n; i++) {
            ins[i].start = at;
            at += ins[i].size;
        }
        *total = at;
        for (Py_ssize_t i = 0; i < n; i++) {
            int next, to, size;

            if (ins[i].target < 0) {
                continue;
            }
            next = ins[i].start + ins[i].size;
            to = ins[ins[i].target].start;
            if ((to >= next) != (ags_opcodes[ins[i].op].jump > 0)) {
                int twin = twin_of(ins[i].op);

                if (twin < 0) {
                    PyErr_Format(PyExc_ValueError, "emit: instruction %zd "
                                 "(opcode %d) cannot jump %s", i, ins[i].op,
                                 to >= next ? "forward" : "backward");
                    return -1;
                }
                ins[i].op = twin;
            }
            ins[i].arg = (uint32_t)(to >= next ? to - next : next - to);
            size = 1 + ags_opcodes[ins[i].op].caches + prefixes(ins[i].arg);
            if (size > ins[i].size) {
                ins[i].size = size;
                changed = 1;
            }
        }
    }
    return 0;
}

static PyObject *
write_code(const emit_ins *ins, Py_ssize_t n, int total)
{
    PyObject *bytes = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total * 2);
    unsigned char *p;

    if (bytes == NULL) {
        return NULL;
    }
    p = (unsigned char *)PyBytes_AS_STRING(bytes);
    memset(p, 0, (size_t)total * 2);
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char *at = p + 2 * ins[i].start;
        int pre = ins[i].size - 1 - ags_opcodes[ins[i].op].caches;

        for (int k = pre; k > 0; k--) {
            *at++ = EXTENDED_ARG;
            *at++ = (unsigned char)(ins[i].arg >> (8 * k));
        }
        *at++ = (unsigned char)ins[i].op;
        *at = (unsigned char)ins[i].arg;
    }
    return bytes;
}

/* Location-table varints: 6-bit groups, least significant first. */
static int
put_varint(emit_buf *b, unsigned int v)
{
    while (v >= 64) {
        if (buf_put(b, (unsigned char)(0x40 | (v & 63))) < 0) {
            return -1;
        }
        v >>= 6;
    }
    return buf_put(b, (unsigned char)v);
}

static int
put_svarint(emit_buf *b, int v)
{
    return put_varint(b, v < 0 ? ((unsigned int)(-v) << 1) | 1
                               : (unsigned int)v << 1);
}

static int
write_lines(const emit_ins *ins, Py_ssize_t n, int firstlineno, emit_buf *b)
{
    int prev = firstlineno;

    for (Py_ssize_t i = 0; i < n; i++) {
        for (int left = ins[i].size; left > 0;) {
            int len = left > 8 ? 8 : left;
            int rc;

            left -= len;
            if (ins[i].line < 0) {
                rc = buf_put(b, (unsigned char)(0x80 | 15 << 3 | (len - 1)));
                if (rc < 0) {
                    return -1;
                }
                continue;
            }
            if (ins[i].col < 0 || ins[i].end_col < 0 || ins[i].end_line < 0) {
                rc = buf_put(b, (unsigned char)(0x80 | 13 << 3 | (len - 1)));
                rc = rc < 0 ? rc : put_svarint(b, ins[i].line - prev);
            }
            else {
                rc = buf_put(b, (unsigned char)(0x80 | 14 << 3 | (len - 1)));
                rc = rc < 0 ? rc : put_svarint(b, ins[i].line - prev);
                rc = rc < 0 ? rc : put_varint(
                    b, (unsigned int)(ins[i].end_line - ins[i].line));
                rc = rc < 0 ? rc
                            : put_varint(b, (unsigned int)ins[i].col + 1);
                rc = rc < 0 ? rc
                            : put_varint(b, (unsigned int)ins[i].end_col + 1);
            }
            if (rc < 0) {
                return -1;
            }
            prev = ins[i].line;
        }
    }
    return 0;
}

/* Exception-table varints: 6-bit groups, most significant first. */
static int
put_entry_varint(emit_buf *b, unsigned int v, int first)
{
    int shift = 0;

    while ((v >> shift) >= 64 && shift < 30) {
        shift += 6;
    }
    for (; shift >= 0; shift -= 6) {
        unsigned char c = (unsigned char)((v >> shift) & 63);

        if (shift > 0) {
            c |= 0x40;
        }
        if (first) {
            c |= 0x80;
            first = 0;
        }
        if (buf_put(b, c) < 0) {
            return -1;
        }
    }
    return 0;
}

static int
write_handlers(const emit_ins *ins, const emit_handler *h, Py_ssize_t nh,
               int total, Py_ssize_t n, emit_buf *b)
{
    for (Py_ssize_t i = 0; i < nh; i++) {
        int start = ins[h[i].start].start;
        int end = h[i].end < n ? ins[h[i].end].start : total;

        if (put_entry_varint(b, (unsigned int)start, 1) < 0
            || put_entry_varint(b, (unsigned int)(end - start), 0) < 0
            || put_entry_varint(b, (unsigned int)ins[h[i].handler].start,
                                0) < 0
            || put_entry_varint(b, (unsigned int)(h[i].depth << 1
                                                  | (h[i].lasti != 0)),
                                0) < 0) {
            return -1;
        }
    }
    return 0;
}

/* CPython's stack effect of `op`, where code generation needs another: a
 * generator's frame is resumed for the first time with a value pushed,
 * which the compiler (adding RETURN_GENERATOR; POP_TOP after computing
 * the depth) never models. */
static int
effect(int op, int arg, int jump)
{
    if (op == RETURN_GENERATOR) {
        return 1;
    }
    return PyCompile_OpcodeStackEffectWithJump(op, arg, jump);
}

/* Depth at each reachable instruction; the maximum in *max. */
static int
stack_depth(const emit_ins *ins, Py_ssize_t n, const emit_handler *h,
            Py_ssize_t nh, int *max)
{
    int *depth = PyMem_Malloc(((size_t)n + 1) * sizeof(int));
    Py_ssize_t *work = PyMem_Malloc(((size_t)n + 1) * sizeof(Py_ssize_t));
    Py_ssize_t top = 0;
    int rc = -1;

#define AGS_REACH(i, d) \
    do { \
        if ((d) < 0) { \
            PyErr_Format(PyExc_ValueError, "emit: stack underflow at " \
                         "instruction %zd", (Py_ssize_t)(i)); \
            goto done; \
        } \
        if (depth[i] < 0) { \
            depth[i] = (d); \
            work[top++] = (i); \
        } \
        else if (depth[i] != (d)) { \
            PyErr_Format(PyExc_ValueError, "emit: instruction %zd is " \
                         "reached at stack depths %d and %d", \
                         (Py_ssize_t)(i), depth[i], (d)); \
            goto done; \
        } \
    } while (0)

    if (depth == NULL || work == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    *max = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        depth[i] = -1;
    }
    if (n > 0) {
        AGS_REACH(0, 0);
    }
    while (top > 0) {
        Py_ssize_t i = work[--top];
        int d = depth[i], op = ins[i].op, arg = (int)ins[i].arg;

        *max = d > *max ? d : *max;
        if (d + effect(op, arg, 0) < 0) {
            PyErr_Format(PyExc_ValueError, "emit: stack underflow at "
                         "instruction %zd", i);
            goto done;
        }
        for (Py_ssize_t k = 0; k < nh; k++) {
            if (h[k].start <= i && i < h[k].end) {
                int hd = h[k].depth + (h[k].lasti != 0) + 1;

                *max = hd > *max ? hd : *max;
                AGS_REACH(h[k].handler, hd);
            }
        }
        if (ins[i].target >= 0) {
            int e = effect(op, arg, 1);

            *max = d + e > *max ? d + e : *max;
            AGS_REACH(ins[i].target, d + e);
        }
        if (!is_stop(op)) {
            int e = effect(op, arg, 0);

            *max = d + e > *max ? d + e : *max;
            if (i + 1 < n) {
                AGS_REACH(i + 1, d + e);
            }
        }
    }
#undef AGS_REACH
    rc = 0;
done:
    PyMem_Free(depth);
    PyMem_Free(work);
    return rc;
}

PyObject *
ags_emit_code(PyObject *template, PyObject *instrs, PyObject *handlers,
              PyObject *fields)
{
    emit_ins *ins = NULL;
    emit_handler *h = NULL;
    emit_buf lines = {NULL, 0, 0}, table = {NULL, 0, 0};
    Py_ssize_t n = 0, nh = 0;
    PyObject *kw = NULL, *code = NULL, *replace = NULL, *empty = NULL;
    PyObject *out = NULL, *first;
    int total = 0, max = 0, firstlineno;

    if (!PyCode_Check(template) || !PyDict_Check(fields)) {
        PyErr_SetString(PyExc_TypeError, "emit(template: code, instructions, "
                        "handlers, fields: dict)");
        return NULL;
    }
    first = PyDict_GetItemString(fields, "co_firstlineno");
    firstlineno = first ? (int)PyLong_AsLong(first)
                        : ((PyCodeObject *)template)->co_firstlineno;
    if ((firstlineno == -1 && PyErr_Occurred())
        || parse_instrs(instrs, &ins, &n) < 0
        || parse_handlers(handlers, n, &h, &nh) < 0
        || layout(ins, n, &total) < 0
        || write_lines(ins, n, firstlineno, &lines) < 0
        || write_handlers(ins, h, nh, total, n, &table) < 0
        || stack_depth(ins, n, h, nh, &max) < 0) {
        goto done;
    }
    code = write_code(ins, n, total);
    kw = PyDict_Copy(fields);
    if (code == NULL || kw == NULL
        || PyDict_SetItemString(kw, "co_code", code) < 0) {
        goto done;
    }
    Py_SETREF(code, PyBytes_FromStringAndSize((char *)lines.p, lines.n));
    if (code == NULL || PyDict_SetItemString(kw, "co_linetable", code) < 0) {
        goto done;
    }
    Py_SETREF(code, PyBytes_FromStringAndSize((char *)table.p, table.n));
    if (code == NULL
        || PyDict_SetItemString(kw, "co_exceptiontable", code) < 0) {
        goto done;
    }
    Py_SETREF(code, PyLong_FromLong(max));
    if (code == NULL || PyDict_SetItemString(kw, "co_stacksize", code) < 0) {
        goto done;
    }
    replace = PyObject_GetAttrString(template, "replace");
    empty = PyTuple_New(0);
    if (replace == NULL || empty == NULL) {
        goto done;
    }
    out = PyObject_Call(replace, empty, kw);
done:
    PyMem_Free(ins);
    PyMem_Free(h);
    PyMem_Free(lines.p);
    PyMem_Free(table.p);
    Py_XDECREF(kw);
    Py_XDECREF(code);
    Py_XDECREF(replace);
    Py_XDECREF(empty);
    return out;
}
