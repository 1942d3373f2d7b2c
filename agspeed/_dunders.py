"""Special methods written in Python: which one a protocol operation of an object runs.

``b[k]``, ``a in b``, ``len(b)``, ``iter(b)`` / ``for x in b`` and the truth of ``b``
(``if b:``, ``not b``, ``bool(b)``) run, in CPython, the slot of ``type(b)``: a
function found on the type's MRO (``_PyType_Lookup``), never on the instance.  When that
function is written in Python, the interpreter inlines it with the object as self, like
any method, so a user's mapping or sequence class (transformers' ``GeneralInterface``, a
``collections.abc.MutableMapping``) captures: its ``__getitem__``, and the mixin methods
it inherits (``Mapping.__contains__``, ``Mapping.get``), run through the interpreter.
Rich comparisons (``==``, ``<``...) take a Python ``__eq__``, ``__lt__``... of either side,
in CPython's order (a subclass's reflected method first, ``NotImplemented`` passing on).
``str(b)`` and ``repr(b)`` take a Python ``__str__`` and ``__repr__`` (object's ``__str__``
being ``repr``).

This module answers one question, ``dunder(obj, source, name)``: the Python function to
inline for the special method ``name`` of ``obj``; False when the type has no such method
at all (or, for ``__ne__``, object's, which is ``not __eq__``, and for ``__str__``,
object's, which is ``repr()``), where CPython falls back
to another one; or None for "take the path you take today" (builtin containers, tensors,
``torch.nn`` containers, C types, the objects ``agspeed._objects`` models, a slot that is
not a plain function).  It is a question of
policy, not only a type lookup (which classes keep their own path, what is guarded on
which source), so it lives in the builder; the interpreter (csrc/interp_dunder.c) asks it
only of constants whose type is a heap type, so builtin values never pay for the call.

Guards: the object's exact type (``("type", source)``) and the function on the class of
the MRO that defines it, ``("attr", class, name)`` with that class reached as
``type(obj).__mro__[k]``, so replacing the method, or the object by one of another
class, recompiles.  An object the capture made has no source: its class's source, when
the capture loaded the class, stands in for ``type(obj)``.
"""

from __future__ import annotations

import types
from typing import Any

from agspeed._sources import MISSING, _class_lookup

__all__ = ["Dunders"]

# The special methods the interpreter may ask about (a name outside it is a bug there).
DUNDER_NAMES = frozenset({"__getitem__", "__contains__", "__len__", "__iter__", "__bool__",
                          "__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__",
                          "__str__", "__repr__"})
# Modules whose classes keep the path they take today: the runtime's own, torch's.
_OWN_PATH_MODULES = ("agspeed", "torch")
# and builtins, and typing's forms (``Optional[int]`` is folded whole: agspeed._folds)
_TYPING_MODULES = ("builtins", "typing", "typing_extensions")


class Dunders:
    """The part of ``GraphBuilder`` that finds Python special methods to inline."""

    def dunder(self, obj: Any, source: Any, name: str) -> tuple | bool | None:
        """``(function, its source or None)`` when ``type(obj)``'s ``name`` is a Python
        function the interpreter should inline with ``obj`` as self; False when the type
        has no ``name`` at all (CPython then falls back: truth to ``__len__``, ``in`` to
        ``__iter__``); None for the usual path (a builtin slot, a class kept apart)."""
        if name not in DUNDER_NAMES:
            raise ValueError(f"dunder: {name!r} is not a special method the capture inlines")
        cls = type(obj)
        if not self._dunder_class(cls):
            return None
        found = _class_lookup(cls, name)
        if isinstance(obj, self._torch.nn.Module) and (  # type: ignore[attr-defined]
                type(found) is not types.FunctionType or
                (found.__module__ or "").split(".", 1)[0] in _OWN_PATH_MODULES):
            # a module keeps its path (torch's containers are modelled: ModuleList[i])
            # unless its own class, outside torch, writes the method
            return None
        if found is MISSING:
            cls_source = self._dunder_class_source(obj, source, cls)
            if cls_source is not None:   # a later call's class must not have gained one
                self.assumptions.append(  # type: ignore[attr-defined]
                    (("attr", cls_source, name), MISSING))
            return False
        if found is object.__ne__ or found is object.__str__:
            # object's != is `not ==`, and its str() is repr(): the interpreter asks for
            # __eq__ (__repr__), so the class must keep object's __ne__ (__str__)
            self._dunder_guard(cls, self._dunder_class_source(obj, source, cls), name, found)
            return False
        if type(found) is not types.FunctionType:
            return None
        cls_source = self._dunder_class_source(obj, source, cls)
        return found, self._dunder_guard(cls, cls_source, name, found)

    def _dunder_guard(self, cls: type, cls_source: Any, name: str, found: Any) -> Any:
        """The source of ``found``, ``name`` on the class of ``cls.__mro__`` that defines
        it, guarded to stay that function; None without a class source."""
        if cls_source is None:
            return None
        k = next(i for i, klass in enumerate(cls.__mro__) if name in klass.__dict__)
        owner = cls_source if k == 0 else ("item", ("attr", cls_source, "__mro__"), k)
        fsource = ("attr", owner, name)
        self.assumptions.append((fsource, found))  # type: ignore[attr-defined]
        return fsource

    def _dunder_class(self, cls: type) -> bool:
        """Whether instances of ``cls`` may take the inlined path at all."""
        module = getattr(cls, "__module__", "") or ""
        if module.split(".", 1)[0] in _OWN_PATH_MODULES or module in _TYPING_MODULES:
            return False
        torch = self._torch  # type: ignore[attr-defined]
        if issubclass(cls, (torch.Tensor, type)):
            return False
        from agspeed._objects import _model_output_type, is_structseq_type

        mo = _model_output_type()
        if mo is not None and issubclass(cls, mo):
            return False   # modelled by agspeed._objects
        return not is_structseq_type(cls)

    def _dunder_class_source(self, obj: Any, source: Any, cls: type) -> Any:
        """The source ``type(obj)`` is guarded by (the guard checks the exact type), or
        None when neither the object nor its class has one."""
        if source is not None:
            self.assumptions.append((("type", source), cls))  # type: ignore[attr-defined]
            return ("type", source)
        known = self.known.get(id(cls))  # type: ignore[attr-defined]
        if known is not None and known[0] is cls:
            return known[1]
        return None

