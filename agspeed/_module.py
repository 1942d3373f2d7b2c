"""Optimized nn.Modules: a view of the original module whose call goes through the runtime.

``optimize(module)`` returns an instance of a subclass made for it, named like the
original class, whose instance ``__dict__`` *is* the original's.  So the two share
everything a module is made of: parameters, buffers, submodules, hooks, ``training``,
``state_dict()`` keys (no prefix), ``parameters()`` identity, and ``isinstance`` still
holds.  The view class adds only what a view needs: ``__call__`` is an
``agspeed._C.Region`` that runs the original class's ``__call__`` (hooks and all) inside
the capture context, and the attributes described under "Class changes" keep the view's
class in step with the original's.  ``optimize()`` modifies neither the original object
nor its class.

Rejected: a wrapper module holding the original as a child (state_dict keys gain a
prefix and attribute access needs forwarding), and patching the original's class or
instance (the original must stay a plain module).

Class changes.  Sharing ``__dict__`` is not enough when code swaps an object's class.
``torch.nn.utils.parametrize.register_parametrization`` (and so ``weight_norm`` and
``spectral_norm`` of ``torch.nn.utils.parametrizations``) moves the tensor out of the
shared ``_parameters`` and gives the one object it is handed a generated subclass with a
property for the tensor; ``remove_parametrizations`` undoes both.  The other object would
lose the attribute.  So the rule is: *a view's class is a view class made over its
original's current class*.

* ``view.__class__`` reads as the original's class, and assigning it assigns the
  original's ``__class__`` (a property on the view class), then moves the view.  Code
  that works on ``module.__class__``, as parametrize does (it subclasses it, assigns it,
  adds and deletes properties on it, reads its ``__bases__``), so acts on a class both
  objects use.  ``type(view)`` is still the view class.
* A class change made on the original itself cannot be seen without patching its class,
  so the view compares ``type(original)`` with its own base and, if they differ, moves
  onto a view class over the new one (``_sync``) whenever it is called, misses an
  attribute (``__getattr__``: the first lookup of a parametrized tensor is a miss), sets
  or deletes one, or has its ``__class__`` read or written.  That covers all parametrize
  relies on; only a method that a swapped-in class overrides, looked up on the view
  before any of those happened, still comes from the old class.  Moving back to the
  class the view was made over gives the view its first class again.
* The cost: a call runs one more Python frame (``_call``, skipped by the hook as runtime
  code) and each attribute miss on the view (``self.<submodule>`` in the root's
  ``forward``) one more Python call.  Submodules are plain modules and pay nothing.
* Rejected: a ``__getattr__`` that reads descriptors off the original's class.  It serves
  reads but not writes (``view.weight = w`` must call the property's setter, not store
  ``w`` in the shared ``__dict__`` where the original's property hides it), nor
  ``type(view)``, ``isinstance(view, ParametrizedLinear)`` or ``remove_parametrizations``
  through the view, and it cannot help the original when the view is parametrized.

Views of views (``optimize(optimize(m))``) keep their nesting: each view's class is made
over its own original's current class, and its call runs that class's ``__call__``.

Making a view class.  It is made over the placeholder base ``_Blank`` and then given its
real base by assigning ``__bases__``, so that the user's ``__init_subclass__`` (a registry
of subclasses, a "final" class that refuses them) never sees agspeed's classes.  That is
done only for metaclasses known not to read the bases while building a class (``type``;
``abc.ABCMeta``, which collects abstract methods, of which an instance's class has none)
and where ``__bases__`` assignment accepts the instance layout (no non-empty
``__slots__``).  Other classes, such as torch.jit's ``ScriptMeta`` ones, are subclassed
the ordinary way, and then their metaclass and ``__init_subclass__`` do see the view
class: that is unavoidable short of building the class outside its metaclass.

Copies.  ``copy.copy``, ``copy.deepcopy`` and pickling copy the original as they would a
plain module and optimize the copy with the same arguments: a shallow copy has its own
``__dict__`` whose values are shared, a deep copy is independent.  Pickling stores the
original plus the optimize() arguments and optimizes again on load.  The view class
defines ``__copy__`` because through ``__reduce_ex__`` a shallow copy would get the
original itself (it does not copy the reduce arguments) and share its ``__dict__``, and
``__deepcopy__`` so that the one a parametrized class brings (which copies into that
class, dropping the view) never applies.
"""

from __future__ import annotations

import abc
import copy
import functools
from typing import Any

from agspeed import _C, _roots

# The metaclasses whose class-building ignores the bases, so that a view class can be made
# over _Blank and rebased without running the user's __init_subclass__.
_PLAIN_METACLASSES = (type, abc.ABCMeta)

# object's own __class__ descriptor: sets an object's type without going through the
# view's __class__ property.
_set_type = object.__dict__["__class__"].__set__


class _Blank:
    """The first base of a view class, replaced by the real one at once (see _subclass)."""


class _View:
    """What every view class of one optimized module shares (as ``__agspeed_view__``).

    ``original`` is the object optimized: a plain module, or a view (``nested``), whose
    own plain module is then ``root``.  ``spec`` holds the optimize() arguments, ``region``
    is the ``__call__`` of every view class of this record and ``home`` the view class
    made at optimize() time, over the class the original had then.
    """

    __slots__ = ("original", "root", "nested", "spec", "region", "home", "root_code")

    def __init__(self, original: Any, ctx: Any, spec: dict) -> None:
        self.original = original
        self.nested = _is_view(original)
        self.root = _record(original).root if self.nested else original
        self.spec = spec
        # the forward's code when it is torch's (agspeed._roots): captured all the same
        self.root_code = None if self.nested else _roots.take(original, True)
        self.region = _C.Region(functools.partial(_call, self), ctx)
        self.home = _view_class(type(original), self)


def _is_view(obj: Any) -> bool:
    return "__agspeed_view__" in vars(type(obj))


def _record(view: Any) -> _View:
    return type(view).__agspeed_view__


def _sync(view: Any) -> bool:
    """Move ``view`` onto a view class over its original's current class; True if moved."""
    record = _record(view)
    if record.nested:
        _sync(record.original)
    base = type(record.original)
    if type(view).__base__ is base:
        return False
    _set_type(view, record.home if record.home.__base__ is base else _view_class(base, record))
    return True


def _call(record: _View, view: Any, /, *args: Any, **kwargs: Any) -> Any:
    """The function a view's Region runs: the original class's ``__call__``, as it is now."""
    _sync(view)
    if record.root_code is None:
        return type(record.original).__call__(view, *args, **kwargs)
    return _roots.call_expecting(record.root_code, type(record.original).__call__, view,
                                 *args, **kwargs)


# -- the view class's attributes -------------------------------------------------------------
#
# `self` is a view and `_record(self)` its record.  Each falls back on the root module's
# class rather than on the next class in the MRO: for a view of a view that is the inner
# view's class, whose attributes are these same functions, which would again read the
# outer view's record.


def _view_getattr(self: Any, name: str) -> Any:
    if _sync(self):
        return getattr(self, name)  # the new class may define it (a parametrization)
    return type(_record(self).root).__getattr__(self, name)


def _view_setattr(self: Any, name: str, value: Any) -> None:
    _sync(self)
    type(_record(self).root).__setattr__(self, name, value)


def _view_delattr(self: Any, name: str) -> None:
    _sync(self)
    type(_record(self).root).__delattr__(self, name)


def _get_class(self: Any) -> type:
    _sync(self)
    return _record(self).original.__class__


def _set_class(self: Any, cls: Any) -> None:
    while isinstance(cls, type) and "__agspeed_view__" in vars(cls):
        cls = cls.__base__  # the class a view class stands for
    _record(self).original.__class__ = cls
    _sync(self)


def _reoptimize(original: Any, backend: Any, options: dict) -> Any:
    from agspeed.api import optimize

    return optimize(original, backend=backend, **options)


def _view_reduce_ex(self: Any, protocol: int) -> tuple:
    record = _record(self)
    return (_reoptimize, (record.original, record.spec["backend"], record.spec["options"]))


def _view_copy(self: Any) -> Any:
    record = _record(self)
    return _reoptimize(copy.copy(record.original), record.spec["backend"],
                       record.spec["options"])


def _view_deepcopy(self: Any, memo: dict) -> Any:
    record = _record(self)
    return _reoptimize(copy.deepcopy(record.original, memo), record.spec["backend"],
                       record.spec["options"])


_CLASS_PROPERTY = property(_get_class, _set_class, doc="The original module's class.")


def _view_class(base: type, record: _View) -> type:
    """A view class for ``record`` over ``base``, the class its original has now."""
    namespace = {
        "__module__": base.__module__,
        "__qualname__": base.__qualname__,
        "__doc__": base.__doc__,
        "__call__": record.region,
        "__class__": _CLASS_PROPERTY,
        "__getattr__": _view_getattr,
        "__setattr__": _view_setattr,
        "__delattr__": _view_delattr,
        "__reduce_ex__": _view_reduce_ex,
        "__copy__": _view_copy,
        "__deepcopy__": _view_deepcopy,
        "__agspeed_view__": record,
        "__agspeed_spec__": record.spec,
        "_orig_mod": record.original,
    }
    return _subclass(base, namespace)


def _subclass(base: type, namespace: dict) -> type:
    """A subclass of ``base``, made without running its ``__init_subclass__`` where possible."""
    meta = type(base)
    if meta in _PLAIN_METACLASSES:
        made = meta(base.__name__, (_Blank,), namespace)
        try:
            made.__bases__ = (base,)
            return made
        except TypeError:  # an instance layout other than a plain class's (__slots__)
            pass
    return meta(base.__name__, (base,), namespace)


def optimize_module(module: Any, ctx: Any, spec: dict) -> Any:
    """An optimized view of ``module`` (see the module docstring)."""
    view = object.__new__(_View(module, ctx, spec).home)
    object.__setattr__(view, "__dict__", module.__dict__)
    _share_distributed_state(module, view)
    return view


def _share_distributed_state(module: Any, view: Any) -> None:
    """Give ``view`` the state torch.distributed's composable APIs (``fully_shard``,
    ``replicate``) keep for ``module``.  They keep it in a table keyed by the module
    object, not in its ``__dict__``, so their methods called on the view
    (``set_requires_gradient_sync``, ``unshard``, ``reshard``) would find none."""
    import sys

    table = sys.modules.get("torch.distributed._composable_state")
    if table is None:
        return
    state = table._get_module_state(module)
    if state is not None and table._get_module_state(view) is None:
        table._insert_module_state(view, state)
