/* bytecode.c: decoding a code object's bytecode into instructions.
 *
 * CPython's bytecode is a sequence of 16-bit units (opcode, oparg).  Up to
 * three EXTENDED_ARG prefixes widen the next argument; each instruction is
 * followed by a fixed number of inline CACHE units that mean nothing to an
 * interpreter reading the base bytecode.  The decoder folds prefixes into
 * one instruction, skips caches, and resolves every relative jump to the
 * byte offset of its target, so that the symbolic interpreter walks a flat
 * array and never repeats the arithmetic.
 *
 * Layout of the result: instrs[0..n) in bytecode order.  For each,
 * `start` is the offset of its first EXTENDED_ARG prefix (what jumps and
 * the exception table point at), `offset` the opcode itself, `next` the
 * offset after its caches, `target` the jump target or -1.  `index` maps a
 * start offset / 2 to the instruction's index (or -1) for O(1) jumps.
 *
 * The bytes come from PyCode_GetCode(): the code's base opcodes, whatever
 * the specializing interpreter or sys.monitoring did to the live copy.
 * Malformed bytecode (a jump outside the code, a truncated instruction) is
 * a ValueError, never a crash: code objects can be built by hand.
 *
 * Exception tables (3.11+, co_exceptiontable): entries of varints in 6-bit
 * groups, bit 0x40 marking another group and bit 0x80 the first byte of an
 * entry; each entry is start, length and handler in code units, then
 * (depth << 1) | lasti.  ags_bc_exceptions decodes them.
 */
#include "agspeed.h"
#include <string.h>

void
ags_bc_release(ags_bytecode *bc)
{
    PyMem_Free(bc->instrs);
    PyMem_Free(bc->index);
    bc->instrs = NULL;
    bc->index = NULL;
    bc->n = 0;
}

static int
malformed(PyCodeObject *code, int offset, const char *what)
{
    PyErr_Format(PyExc_ValueError, "malformed bytecode in %R at offset %d: %s",
                 code, offset, what);
    return -1;
}

int
ags_bc_decode(PyCodeObject *code, ags_bytecode *bc)
{
    PyObject *bytes = PyCode_GetCode(code);
    const uint8_t *p;
    Py_ssize_t size, n_units;
    uint32_t arg = 0;
    int start = -1, rc = -1;

    memset(bc, 0, sizeof(*bc));
    if (bytes == NULL) {
        return -1;
    }
    p = (const uint8_t *)PyBytes_AS_STRING(bytes);
    size = PyBytes_GET_SIZE(bytes);
    n_units = size / 2;
    if (size % 2 != 0 || size > INT32_MAX) {
        malformed(code, 0, "odd or oversized length");
        goto done;
    }
    bc->instrs = PyMem_Calloc((size_t)(n_units ? n_units : 1),
                              sizeof(ags_instr));
    bc->index = PyMem_Malloc((size_t)(n_units ? n_units : 1) * sizeof(int));
    if (bc->instrs == NULL || bc->index == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    bc->n_units = n_units;
    for (Py_ssize_t u = 0; u < n_units; u++) {
        bc->index[u] = -1;
    }
    for (int off = 0; off < size;) {
        uint8_t op = p[off];
        ags_instr *ins;
        int next;

        if (start < 0) {
            start = off;
        }
        arg = (arg << 8) | p[off + 1];
        if (op == EXTENDED_ARG) {
            off += 2;
            continue;
        }
        if (op == CACHE) {
            malformed(code, off, "CACHE where an instruction should be");
            goto done;
        }
        next = off + 2 + 2 * ags_opcodes[op].caches;
        if (next > size) {
            malformed(code, off, "instruction runs past the end");
            goto done;
        }
        ins = &bc->instrs[bc->n];
        ins->start = start;
        ins->offset = off;
        ins->next = next;
        ins->opcode = op;
        ins->arg = arg;
        ins->target = -1;
        if (ags_opcodes[op].jump != 0) {
            int64_t target = (int64_t)next
                             + 2 * (int64_t)ags_opcodes[op].jump * arg;
            if (target < 0 || target >= size) {
                malformed(code, off, "jump target outside the code");
                goto done;
            }
            ins->target = (int)target;
        }
        bc->index[start / 2] = (int)bc->n;
        bc->n++;
        arg = 0;
        start = -1;
        off = next;
    }
    if (start >= 0) {
        malformed(code, start, "EXTENDED_ARG at the end");
        goto done;
    }
    for (Py_ssize_t i = 0; i < bc->n; i++) {
        int t = bc->instrs[i].target;
        if (t >= 0 && bc->index[t / 2] < 0) {
            malformed(code, bc->instrs[i].offset,
                      "jump into the middle of an instruction");
            goto done;
        }
    }
    rc = 0;
done:
    Py_DECREF(bytes);
    if (rc < 0) {
        ags_bc_release(bc);
    }
    return rc;
}

PyObject *
ags_bc_to_list(PyCodeObject *code)
{
    ags_bytecode bc;
    PyObject *list;

    if (ags_bc_decode(code, &bc) < 0) {
        return NULL;
    }
    list = PyList_New(bc.n);
    for (Py_ssize_t i = 0; list != NULL && i < bc.n; i++) {
        ags_instr *ins = &bc.instrs[i];
        PyObject *item = Py_BuildValue("(iiiIii)", ins->start, ins->offset,
                                       (int)ins->opcode, ins->arg,
                                       ins->target, ins->next);
        if (item == NULL) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, i, item);
    }
    ags_bc_release(&bc);
    return list;
}

/* ------------------------------------------------------------------ */
/* Return codes */

PyObject *
ags_bc_return_code(PyCodeObject *code)
{
    unsigned char units[2 * (2 + 2 * 16)];
    int n = 0;
    PyObject *bytes = NULL, *kwargs = NULL, *replace = NULL, *empty = NULL;
    PyObject *args = NULL, *result = NULL;
    const int ops[2] = {RESUME, RETURN_VALUE};

    /* ags_frame_return jumps to the unit after RESUME */
    Py_BUILD_ASSERT(AGS_RETURN_UNIT == 1);

    for (int k = 0; k < 2; k++) {
        units[n++] = (unsigned char)ops[k];
        units[n++] = 0;
        for (int c = 0; c < ags_opcodes[ops[k]].caches; c++) {
            units[n++] = 0;
            units[n++] = 0;
        }
    }
    bytes = PyBytes_FromStringAndSize((const char *)units, n);
    empty = PyBytes_FromStringAndSize(NULL, 0);
    args = PyTuple_New(0);
    replace = PyObject_GetAttrString((PyObject *)code, "replace");
    if (bytes == NULL || empty == NULL || args == NULL || replace == NULL) {
        goto done;
    }
    kwargs = Py_BuildValue("{s:O,s:i,s:O,s:O}", "co_code", bytes,
                           "co_stacksize", 1, "co_linetable", empty,
                           "co_exceptiontable", empty);
    if (kwargs == NULL) {
        goto done;
    }
    result = PyObject_Call(replace, args, kwargs);
done:
    Py_XDECREF(bytes);
    Py_XDECREF(empty);
    Py_XDECREF(args);
    Py_XDECREF(replace);
    Py_XDECREF(kwargs);
    return result;
}

/* ------------------------------------------------------------------ */
/* Exception tables */

/* Reads one varint at *pos of `table` (n bytes): 0, or -1 when the table
 * ends inside it. */
static int
read_varint(const unsigned char *table, Py_ssize_t n, Py_ssize_t *pos,
            long *out)
{
    unsigned char byte;
    long value;

    if (*pos >= n) {
        return -1;
    }
    byte = table[(*pos)++];
    value = byte & 63;
    while (byte & 64) {
        if (*pos >= n || value > (LONG_MAX >> 6)) {
            return -1;
        }
        byte = table[(*pos)++];
        value = (value << 6) | (byte & 63);
    }
    *out = value;
    return 0;
}

int
ags_bc_exceptions(PyCodeObject *code, ags_except **out, Py_ssize_t *n_out)
{
    PyObject *bytes = code->co_exceptiontable;
    const unsigned char *table;
    Py_ssize_t n, pos = 0, count = 0, cap = 0;
    ags_except *entries = NULL;

    *out = NULL;
    *n_out = 0;
    if (bytes == NULL || !PyBytes_Check(bytes)) {
        return 0;
    }
    table = (const unsigned char *)PyBytes_AS_STRING(bytes);
    n = PyBytes_GET_SIZE(bytes);
    while (pos < n) {
        long start, length, handler, depth_lasti;

        if (read_varint(table, n, &pos, &start) < 0
            || read_varint(table, n, &pos, &length) < 0
            || read_varint(table, n, &pos, &handler) < 0
            || read_varint(table, n, &pos, &depth_lasti) < 0) {
            PyMem_Free(entries);
            return malformed(code, -1, "truncated exception table");
        }
        if (count == cap) {
            ags_except *grown;

            cap = cap ? cap * 2 : 8;
            grown = PyMem_Realloc(entries, (size_t)cap * sizeof(ags_except));
            if (grown == NULL) {
                PyMem_Free(entries);
                PyErr_NoMemory();
                return -1;
            }
            entries = grown;
        }
        entries[count].start = (int)(start * 2);
        entries[count].end = (int)((start + length) * 2);
        entries[count].handler = (int)(handler * 2);
        entries[count].depth = (int)(depth_lasti >> 1);
        entries[count].lasti = (int)(depth_lasti & 1);
        count++;
    }
    *out = entries;
    *n_out = count;
    return 0;
}

PyObject *
ags_bc_exceptions_list(PyCodeObject *code)
{
    ags_except *entries;
    Py_ssize_t n;
    PyObject *list;

    if (ags_bc_exceptions(code, &entries, &n) < 0) {
        return NULL;
    }
    list = PyList_New(n);
    for (Py_ssize_t k = 0; list != NULL && k < n; k++) {
        ags_except *e = &entries[k];
        PyObject *item = Py_BuildValue("(iiiii)", e->start, e->end,
                                       e->handler, e->depth, e->lasti);
        if (item == NULL) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, k, item);
    }
    PyMem_Free(entries);
    return list;
}
