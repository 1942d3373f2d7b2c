/* protocol.h: every kind that crosses between C and Python, defined once.
 *
 * Each kind is one table, an X-macro list whose rows name the kind and say
 * what it means.  The C side gets an enum from each table (AGS_<PREFIX>_
 * <NAME>), and protocol.c exports every table to Python as
 * agspeed._C.PROTOCOL, from which agspeed/protocol.py makes one IntEnum per
 * table.  Python code names kinds through those enums (Plan.GRAPH,
 * Reason.SIDE_EFFECT, Load.ATTR...), and C dispatches on their values with
 * a switch or a table indexed by them, never by comparing strings.  Adding a
 * kind is adding one row here (and, for a kind with behaviour, the row of
 * its handler where the table says).
 *
 * The floor: this header includes nothing of agspeed's, so csrc/ and
 * guards/ can both stand on it.
 *
 * Columns: X(NAME, "meaning") unless the table says otherwise.  The Python
 * name of a row is its NAME in lower case.
 */
#ifndef AGS_PROTOCOL_H
#define AGS_PROTOCOL_H

#include "compat.h"

/* What the hook does with a frame, decided by the capture context
 * (codecache.c, hook.c). */
#define AGS_ACTION_LIST(X) \
    X(SKIP, "never look at this code object again, in any context: every " \
            "later frame of it runs untouched (its callees are still seen)") \
    X(RUN_EAGER, "run the frame's own bytecode; its callees still pass " \
                 "through the hook") \
    X(CALL, "call compiled(f_locals, f_globals, f_builtins) and return its " \
            "result from the frame without running the frame's bytecode; an " \
            "exception it raises propagates from the frame") \
    X(PASS, "run this frame untouched and remember nothing: the answer " \
            "depends on where the frame is reached (the torch code of an " \
            "optimized root, reached outside that root's call)") \
    X(DISABLE, "run the frame with the runtime off, in any context: " \
               "neither it nor anything it calls is captured (the wrapper " \
               "torch.compiler.disable puts around a function)")

/* Why capture stopped: a stable id, X(NAME, "what happened", "hint").  The
 * interpreter stops with one (ags_stop), the builder raises GraphBreak
 * with one, and logs, explain() and fullgraph errors show both texts. */
#define AGS_REASON_LIST(X) \
    X(DATA_DEPENDENT, "the result depends on the values inside a tensor", \
      "keep data-dependent Python (.item(), nonzero, branching on tensor " \
      "values) outside the optimized code, or accept a graph break there") \
    X(OP_FAILED, "the operation failed on the shapes and dtypes it was " \
                 "given", \
      "the frame runs eager, which raises eager's own error for these " \
      "inputs") \
    X(UNSUPPORTED_CALL, "a call the capture does not model", \
      "move it out of the optimized code, or wrap it with agspeed.disable") \
    X(UNSUPPORTED_ATTRIBUTE, "an attribute that only running code could " \
                             "produce", \
      "read it outside the optimized code and pass the value in") \
    X(UNSUPPORTED_VALUE, "a value the capture does not model", \
      "pass tensors and plain values") \
    X(NON_TENSOR_RESULT, "an operation returned something other than " \
                         "tensors and plain values", \
      "keep such calls outside the optimized code") \
    X(BAD_CALL, "the call's arguments do not match the function's " \
                "parameters", \
      "the frame runs eager, which raises eager's own TypeError") \
    X(HOOKS, "the module has hooks (or a custom __call__), which run only " \
             "in eager", \
      "the module runs eager with its hooks; its forward is still " \
      "captured") \
    X(SIDE_EFFECT, "a write to an object of the program (an attribute or " \
                   "an item)", \
      "return the value instead and store it outside the optimized code") \
    X(UNSUPPORTED_INSTRUCTION, "Python the capture does not model " \
                               "(del, yield, import...)", \
      "move it into a helper called from the optimized code; the helper " \
      "runs eager") \
    X(EXCEPTION_HANDLER, "an exception handler was entered: the code " \
                         "raised while capturing", \
      "the frame runs eager, where the handler runs") \
    X(GENERATOR, "a generator that leaves the optimized code, or a " \
                 "coroutine, runs eager", \
      "consume the generator where it is made (tuple(gen), a for loop) and " \
      "return a tensor or a tuple") \
    X(RAISE, "the code raises an exception", \
      "the frame runs eager and raises it") \
    X(TOO_LONG, "too many instructions (a long or endless loop)", \
      "loop over fewer items, or move the loop out of the optimized code") \
    X(TOO_DEEP, "calls nested too deeply to inline", "flatten the recursion") \
    X(CLOSURE, "a nested function with free variables", \
      "define the function at module level and pass values in") \
    X(MISSING_ATTRIBUTE, "the attribute does not exist", \
      "the frame runs eager and raises") \
    X(UNBOUND_LOCAL, "a local read before it is assigned", \
      "the frame runs eager and raises") \
    X(UNGUARDABLE_ATTRIBUTE, "an attribute of an object with no source to " \
                             "guard it by", \
      "pass the value in as an argument") \
    X(UNGUARDABLE_GLOBAL, "a global the guard could not check", \
      "pass the value in") \
    X(UNKNOWN_GLOBAL, "a name that is neither a global nor a builtin", \
      "the frame runs eager and raises NameError")

/* What the interpreter asks of its builder (agspeed._graph.GraphBuilder):
 * the method of that name, called with the arguments shown.  A builder
 * that lacks one is refused when it is made (agspeed/protocol.py). */
#define AGS_BUILDER_OP_LIST(X) \
    X(INPUT, "input(source, value) -> node: a graph input read from " \
             "source (a tensor, or a NumPy array as the tensor sharing its " \
             "memory); None for an array that cannot be one") \
    X(ATTR, "attr(obj, name) -> (Attr, value, owner): an attribute found " \
            "without running user code") \
    X(TENSOR_ATTR, "tensor_attr(node, name) -> value: metadata or a node") \
    X(BIND, "bind(func, nargs, kwnames) -> parameter slots: each an " \
            "argument index or (Bind, payload)") \
    X(PLAN_CALL, "plan_call(fn, source) -> (Plan, ...): how a call is " \
                 "captured") \
    X(CALL_FUNCTION, "call_function(fn, args, kwargs) -> node or value") \
    X(CALL_METHOD, "call_method(name, args, kwargs) -> node: a tensor " \
                   "method") \
    X(FOLD, "fold(fn, args, kwargs) -> value: evaluated now on known " \
            "values") \
    X(CONTAINER_METHOD, "container_method(spec, args, kwargs) -> value: a " \
                        "method of a list, tuple or dict built here") \
    X(GETITEM, "getitem(container, index, source) -> (value, source)") \
    X(SETITEM, "setitem(node, index, value): item assignment on a tensor") \
    X(COMPARE, "compare(Compare, a, b) -> node or bool") \
    X(IDENTITY, "identity(a, b) -> None: `a is b` of two known objects, " \
                "decided by the interpreter; their identity is assumed") \
    X(TRUTH, "truth(obj) -> bool, decided without running user code") \
    X(ASSUME_TRUTH, "assume_truth(obj, truth) -> bool: the truth of a " \
                    "value a branch depends on whose other way only " \
                    "raises: a tensor's is assumed to be truth and checked " \
                    "after the graph (agspeed/_assume.py); anything else's " \
                    "as truth(obj) answers") \
    X(ITERATE, "iterate(obj, source) -> ((element, source or None), ...)") \
    X(FORMAT, "format(value, conversion, spec) -> str: an f-string part") \
    X(EFFECT_SETATTR, "effect_setattr(obj, source, name, value): " \
                      "obj.name = value on an object of the program, " \
                      "replayed after the graph") \
    X(WRITTEN, "written(obj, name) -> (value,) or None: what this capture " \
               "stored in obj.name (an effect not yet replayed), if it did") \
    X(SHADOW, "shadow(obj, source) -> container: an owned copy of a list " \
              "or dict of the program, changed in its place; its final " \
              "contents are written back after the graph; for a list " \
              "with a tail, that tail with the list's items put in " \
              "front") \
    X(DICT_KEY, "dict_key(dict, node) -> None: a tensor stored as a key of " \
                "dict (a shadow), taken where the entry can write that " \
                "very tensor back (a graph input), else a GraphBreak") \
    X(TAIL, "tail(obj, source) -> list: a new empty list standing for " \
            "what the frame appends to the list of the program obj; " \
            "extended onto it after the graph") \
    X(ENTER_WITH, "enter_with(cm, source) -> (exit, enter): the callables " \
                  "a with block calls, enter() on entry and exit(None, " \
                  "None, None) when the block ends normally") \
    X(CTX, "ctx(fn, args, kwargs) -> value: a context manager's " \
           "construction, enter or exit, modelled by the builder") \
    X(NEW_OBJECT, "new_object(cls) -> object: a fresh instance made by the " \
                  "class's builtin __new__, owned by the capture") \
    X(STORE_ATTR, "store_attr(obj, name, value) -> None once stored on an " \
                  "object the capture made, or a function to inline: a " \
                  "__setattr__ as f(obj, name, value), a property's setter " \
                  "as f(obj, value)") \
    X(DUNDER, "dunder(obj, source, name) -> (func, source or None), " \
              "False or None: the Python function type(obj) runs for the " \
              "special method name (__getitem__, __contains__, __len__, " \
              "__iter__, __bool__), inlined with obj as self; False when " \
              "the type has no such method (CPython's fallback applies); " \
              "None keeps the usual path")

/* How a call is captured: the first item of plan_call's answer. */
#define AGS_PLAN_LIST(X) \
    X(GRAPH, "(GRAPH, fn): a node of the graph") \
    X(FOLD, "(FOLD, fn): evaluated now on known values") \
    X(INLINE, "(INLINE, func, bound self or None, source or None): the " \
              "function's bytecode is interpreted in place") \
    X(MODULE, "(MODULE, forward, module or None, source): an nn.Module " \
              "call, its forward inlined") \
    X(GETATTR, "(GETATTR,): getattr() with a constant name") \
    X(HASATTR, "(HASATTR,): hasattr() with a constant name") \
    X(GEN_CTX, "(GEN_CTX, func, source or None): a function made by " \
               "@contextlib.contextmanager: func's generator, entered and " \
               "left by a with block (interp_gen.c)") \
    X(RAW_GETATTR, "(RAW_GETATTR,): object.__getattribute__(obj, name) " \
                   "with a constant name: getattr() past the class's own " \
                   "__getattribute__") \
    X(SETATTR, "(SETATTR,): setattr(obj, name, value) with a constant " \
               "name: obj.name = value, as STORE_ATTR does it") \
    X(CONST, "(CONST, value): a call whose result is known") \
    X(SUPER, "(SUPER,): super() of the running method") \
    X(CTX, "(CTX, fn): a context manager the builder models (grad mode, " \
           "autocast): made, entered or left by ctx()") \
    X(MAP, "(MAP,): map(fn, *iterables), fn called per element " \
           "(interp_iter.c)") \
    X(FILTER, "(FILTER,): filter(fn or None, iterable)") \
    X(REDUCE, "(REDUCE,): functools.reduce(fn, iterable[, initial])") \
    X(PARTIAL, "(PARTIAL, func, args, keywords, func's source or None): " \
               "a call through a functools.partial, its arguments graph " \
               "arguments") \
    X(NEW, "(NEW, cls, __init__ or None, its source or None): an instance " \
           "made by new_object, its __init__ inlined on it")

/* Where an attribute was found: the first item of attr's answer. */
#define AGS_ATTR_LIST(X) \
    X(VALUE, "a plain value") \
    X(METHOD, "a function to call with the owner as self") \
    X(PROPERTY, "a property whose getter is inlined") \
    X(MISSING, "no such attribute") \
    X(UNSUPPORTED, "a descriptor or __getattr__ only running code could " \
                   "answer (the builder breaks; C never receives it)") \
    X(WRITTEN, "a value this capture wrote there (a graph argument, not " \
               "guarded: the entry stores it after the graph)")

/* A parameter slot of bind's answer that is not an argument index. */
#define AGS_BIND_LIST(X) \
    X(DEFAULT, "(DEFAULT, value): the parameter's default") \
    X(STAR, "(STAR, (indices...)): the arguments that go to *args") \
    X(STARSTAR, "(STARSTAR, {name: index}): those that go to **kwargs")

/* Comparisons the builder evaluates: X(NAME, "operator", "meaning"). */
#define AGS_COMPARE_LIST(X) \
    X(LT, "<", "a < b") \
    X(LE, "<=", "a <= b") \
    X(EQ, "==", "a == b") \
    X(NE, "!=", "a != b") \
    X(GT, ">", "a > b") \
    X(GE, ">=", "a >= b") \
    X(IN, "in", "a in b") \
    X(NOT_IN, "not in", "a not in b")

/* How a guard program reaches a value, one per kind of source: a source is
 * a tuple whose first item is the row's name in lower case
 * (agspeed/_sources.py). */
#define AGS_LOAD_LIST(X) \
    X(LOCAL, "(local, name): a local of the frame") \
    X(GLOBAL, "(global, name): a global of the frame, else a builtin") \
    X(GMOD, "(gmod, module name, name): a global of a loaded module") \
    X(ATTR, "(attr, base, name): an attribute, found without running " \
            "user code") \
    X(ITEM, "(item, base, key): an item of a tuple, list, dict or deque") \
    X(CELL, "(cell, function, index): the contents of a closure cell") \
    X(TYPE, "(type, base): the exact type of the base") \
    X(FGET, "(fget, base): the getter of a property") \
    X(CVAR, "(cvar, base): the value of a contextvars.ContextVar in the " \
            "running context (its get()), or missing when it has none") \
    X(NUMPY, "(numpy, base): the tensor sharing the memory of the NumPy " \
             "array base (torch.from_numpy), or missing when base is not " \
             "an array torch can share") \
    X(KEYS, "(keys, base): the keys of the dict base as a tuple, in order, " \
            "or missing when base is not a dict") \
    X(VALUES, "(values, base): the values of the dict base as a tuple, in " \
              "order, or missing when base is not a dict") \
    X(STORAGE, "(storage, base): the size in bytes of the storage under " \
               "the tensor base, or missing when base is not a tensor") \
    X(STATE, "(state, base): a snapshot of the plain data base holds, " \
             "deeply (agspeed/_copies.py), or missing when it holds more") \
    X(INFERENCE, "(inference, base): whether the tensor base is an " \
                 "inference tensor (is_inference()), or missing when base " \
                 "is not a tensor")

/* What a guard checks of one value (guards/check.c has a row of
 * behaviour for each; agspeed/guards/checks.py a class). */
#define AGS_CHECK_LIST(X) \
    X(TENSOR, "a tensor's exact type, dtype, device, shape, strides and " \
              "requires_grad") \
    X(EQ, "a plain value's exact type and equality") \
    X(LEN, "a container's exact type and length") \
    X(ID, "identity with one object, held weakly where it can be") \
    X(ABSENT, "the attribute or item is not there") \
    X(DYNTENSOR, "a tensor check whose sizes may be symbols and whose " \
                 "strides may be expressions of them") \
    X(DYNINT, "an exact int whose value binds a symbol (a Python int the " \
              "capture made dynamic)")

/* Flags of a guard program: X(NAME, bit, "meaning"). */
#define AGS_GFLAG_LIST(X) \
    X(CHECK_KNOWN_TENSORS, 1, "tensor checks run even on parameters and " \
                              "buffers the structure memo remembers") \
    X(NO_MEMO, 2, "never remember structure")

/* The parts of a guard program a failure is reported against (why()). */
#define AGS_PART_LIST(X) \
    X(CHECK, "a check, by index into the program's checks") \
    X(ALIAS, "an alias pair, by index") \
    X(DISTINCT, "a load of the distinct list that reached the same object " \
                "as another, by its index in the list") \
    X(SIZE, "a size guard of a dynamic program, by index") \
    X(PROBE, "a global-state probe")

/* Postfix operations of size expressions (guards/symbolic.c):
 * X(NAME, immediate words, "meaning"). */
#define AGS_SOP_LIST(X) \
    X(CONST, 1, "push the immediate") \
    X(SYM, 1, "push the value of symbol <immediate>; fails if unbound") \
    X(ADD, 0, "a + b") \
    X(MUL, 0, "a * b") \
    X(NEG, 0, "-a") \
    X(FLOORDIV, 0, "floor(a / b), as Python's //; b == 0 fails") \
    X(MOD, 0, "a % b with the sign of b, as Python's %; b == 0 fails") \
    X(POW, 0, "a ** b for b >= 0; b < 0 fails") \
    X(MIN, 0, "min(a, b)") \
    X(MAX, 0, "max(a, b)") \
    X(EQ, 0, "a == b (1 or 0)") \
    X(NE, 0, "a != b") \
    X(LT, 0, "a < b") \
    X(LE, 0, "a <= b") \
    X(GT, 0, "a > b") \
    X(GE, 0, "a >= b") \
    X(AND, 0, "a and b, as 1 or 0") \
    X(OR, 0, "a or b, as 1 or 0") \
    X(NOT, 0, "not a")

/* The enums. */
/* The fused kernels' instruction set (backends/nvrtc): a kernel is a list
 * of these in SSA order, instruction i defining value i.  X(NAME, operands,
 * "meaning"); the operands are earlier values, but for LOAD (an input's
 * index) and CONST (the number is the instruction's immediate).  Values
 * compute in the instruction's type (KTYPE): float for every floating
 * storage type but double, whose values stay double.  backends/nvrtc/
 * codegen.c has each one's CUDA expression. */
#define AGS_KOP_LIST(X) \
    X(LOAD, 0, "input <operand> at this element, converted to the type") \
    X(CONST, 0, "the immediate") \
    X(CAST, 1, "a converted to the type (C rules; bool: a != 0; to F16 " \
                 "or BF16: rounded to it, computed on in float)") \
    X(NEG, 1, "-a") \
    X(ABS, 1, "|a|") \
    X(EXP, 1, "e ** a") \
    X(LOG, 1, "natural logarithm") \
    X(LOG1P, 1, "log(1 + a)") \
    X(EXPM1, 1, "e ** a - 1") \
    X(SQRT, 1, "square root") \
    X(RSQRT, 1, "1 / sqrt(a)") \
    X(RECIPROCAL, 1, "1 / a") \
    X(TANH, 1, "hyperbolic tangent") \
    X(SIGMOID, 1, "1 / (1 + e ** -a)") \
    X(ERF, 1, "the error function") \
    X(SIN, 1, "sine") \
    X(COS, 1, "cosine") \
    X(FLOOR, 1, "round down") \
    X(CEIL, 1, "round up") \
    X(TRUNC, 1, "round toward zero") \
    X(SIGN, 1, "-1, 0 or 1 (NaN stays NaN)") \
    X(RELU, 1, "max(a, 0), NaN kept") \
    X(NOT, 1, "logical not") \
    X(ISNAN, 1, "a is NaN") \
    X(ADD, 2, "a + b") \
    X(SUB, 2, "a - b") \
    X(MUL, 2, "a * b") \
    X(DIV, 2, "a / b (true division)") \
    X(POW, 2, "a ** b") \
    X(MAX, 2, "the larger; NaN if either is") \
    X(MIN, 2, "the smaller; NaN if either is") \
    X(EQ, 2, "a == b") \
    X(NE, 2, "a != b") \
    X(LT, 2, "a < b") \
    X(LE, 2, "a <= b") \
    X(GT, 2, "a > b") \
    X(GE, 2, "a >= b") \
    X(AND, 2, "logical and") \
    X(OR, 2, "logical or") \
    X(WHERE, 3, "b if a else c") \
    X(SUM, 1, "the sum of a over the reduced dimensions (rows kernels)") \
    X(AMAX, 1, "the largest a over the reduced dimensions; NaN if any is") \
    X(AMIN, 1, "the smallest a over the reduced dimensions; NaN if any is")

/* The shapes of fused kernels' work (backends/nvrtc/codegen.c). */
#define AGS_KKIND_LIST(X) \
    X(POINTWISE, "one thread per element, in a grid-stride loop") \
    X(ROWS, "one block per row; the row's trailing dimensions are reduced")

/* Storage types of fused kernels' inputs and outputs, and the types their
 * values compute in: X(NAME, "CUDA storage type", bytes, "meaning"). */
#define AGS_KTYPE_LIST(X) \
    X(F32, "float", 4, "torch.float32") \
    X(F16, "unsigned short", 2, "torch.float16, computed in float") \
    X(BF16, "unsigned short", 2, "torch.bfloat16, computed in float") \
    X(F64, "double", 8, "torch.float64") \
    X(I64, "long long", 8, "torch.int64") \
    X(I32, "int", 4, "torch.int32") \
    X(I8, "signed char", 1, "torch.int8") \
    X(U8, "unsigned char", 1, "torch.uint8") \
    X(BOOL, "bool", 1, "torch.bool")

#define AGS_PROTO_ENUM(P, LIST) \
    typedef enum { LIST(AGS_PROTO_ROW_##P) AGS_##P##_COUNT } ags_##P##_kind;

#define AGS_PROTO_ROW_ACTION(name, ...) AGS_ACTION_##name,
#define AGS_PROTO_ROW_REASON(name, ...) AGS_REASON_##name,
#define AGS_PROTO_ROW_BOP(name, ...) AGS_BOP_##name,
#define AGS_PROTO_ROW_PLAN(name, ...) AGS_PLAN_##name,
#define AGS_PROTO_ROW_ATTR(name, ...) AGS_ATTR_##name,
#define AGS_PROTO_ROW_BIND(name, ...) AGS_BIND_##name,
#define AGS_PROTO_ROW_COMPARE(name, ...) AGS_COMPARE_##name,
#define AGS_PROTO_ROW_LOAD(name, ...) AGS_LOAD_##name,
#define AGS_PROTO_ROW_CHECK(name, ...) AGS_CHECK_##name,
#define AGS_PROTO_ROW_PART(name, ...) AGS_PART_##name,
#define AGS_PROTO_ROW_SOP(name, ...) AGS_SOP_##name,
#define AGS_PROTO_ROW_KOP(name, ...) AGS_KOP_##name,
#define AGS_PROTO_ROW_KTYPE(name, ...) AGS_KTYPE_##name,
#define AGS_PROTO_ROW_KKIND(name, ...) AGS_KKIND_##name,

AGS_PROTO_ENUM(ACTION, AGS_ACTION_LIST)
AGS_PROTO_ENUM(REASON, AGS_REASON_LIST)
AGS_PROTO_ENUM(BOP, AGS_BUILDER_OP_LIST)
AGS_PROTO_ENUM(PLAN, AGS_PLAN_LIST)
AGS_PROTO_ENUM(ATTR, AGS_ATTR_LIST)
AGS_PROTO_ENUM(BIND, AGS_BIND_LIST)
AGS_PROTO_ENUM(COMPARE, AGS_COMPARE_LIST)
AGS_PROTO_ENUM(LOAD, AGS_LOAD_LIST)
AGS_PROTO_ENUM(CHECK, AGS_CHECK_LIST)
AGS_PROTO_ENUM(PART, AGS_PART_LIST)
AGS_PROTO_ENUM(SOP, AGS_SOP_LIST)
AGS_PROTO_ENUM(KOP, AGS_KOP_LIST)
AGS_PROTO_ENUM(KTYPE, AGS_KTYPE_LIST)
AGS_PROTO_ENUM(KKIND, AGS_KKIND_LIST)

typedef ags_ACTION_kind ags_action;

/* Flags are bits, not indices. */
enum {
#define AGS_X(name, bit, doc) AGS_GFLAG_##name = (bit),
    AGS_GFLAG_LIST(AGS_X)
#undef AGS_X
};

/* The lower-case names of a table's rows: sources' tags ("local",
 * "attr"...: ags_load_names[AGS_LOAD_ATTR] is "attr") and the builder's
 * method names. */
extern const char *ags_load_names[];
extern const char *ags_bop_names[];
extern const int ags_sop_immediates[];

/* Fills the name tables above.  Runs once, before anything reads them. */
void ags_protocol_init(void);

/* Adds PROTOCOL, {table name: ((name, value, columns...), ...)}, to the
 * module.  0, or -1 with an exception set. */
int ags_protocol_export(PyObject *module);

/* The value of `obj` as a row of a table with `count` rows: 0 with *out
 * set, or -1 with TypeError/ValueError naming `table` (an unknown kind
 * fails loudly). */
int ags_protocol_kind(PyObject *obj, int count, const char *table, int *out);

#endif /* AGS_PROTOCOL_H */
