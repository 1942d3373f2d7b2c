"""Side effects: writes to the program's objects and calls made for their effect, recorded
during capture and replayed after the graph.

A frame may change objects that existed before the call: ``self.calls += 1`` on a module,
``cfg.last_shape = x.shape`` on a config object, ``self.cache = hidden`` to keep a tensor
for later; or call something only for what it does: ``logger.info("loss %s", loss)``.
The graph computes tensors only, so none of these can be a node, and running the whole
frame eager for them would throw away the graph.  Instead the capture records each one,
in program order, and the cache entry replays them after the graph has run, so a later
call (and the caller) sees exactly the state eager would have left.

* Attribute writes (``effect_setattr``): ``(owner's source, owner, name, value)``.  Reads see
  writes: after ``self.n = 3`` the capture reads ``self.n`` as 3 (``written``, answered to
  the interpreter as ``Attr.WRITTEN``: a graph argument, not guarded, since it is what
  this very call stores), even when the write stored a tensor the graph computes.  The
  owner is reached through its source, whose identity the guard already checks, and the
  entry reads it again from that source on every call (the entry's extra inputs:
  ``owner_sources``), so the write lands on the object eager would write to.  A value the
  frame read before writing it (``self.calls`` in ``self.calls += 1``) is guarded as any
  read is: such a counter makes each call capture again, until the recompile limit
  makes the frame run eager.
* Calls replayed (``replay_call``): logging (``logger.info(...)``, the ``logging``
  module's functions, transformers' ``warning_once``).  Inside a checkpointed region
  each breaks: eager makes the call again when the backward recomputes the region.
  (``print`` breaks, as in torch._dynamo.)  The call is made again on every
  run of the entry, with the tensors the graph computed, so the logger's own level check
  decides at run time, as in eager, whether anything is written.  A ``Logger`` method
  or ``logging`` function is replayed as ``agspeed._logged.log_at``: its record names
  the file, line and function of the program's call (``stacklevel`` frames up, as in
  eager), read from the interpreter, not the replay's own place.  ``warnings.warn`` is
  replayed as ``warnings.warn_explicit`` at the place eager's would name: the line of the
  frame ``stacklevel`` frames up from the call, read from the interpreter
  (``_C.capture_site``), with that module's registry, so warning filters ("once per
  location") see what they see in eager.  A stacklevel that names a caller of the
  optimized frame breaks.
* Values.  Each tensor a replayed effect needs is an output of the graph: the graph
  returns ``(result, tensors)``, and each effect keeps a template of its value in which
  the tensors are slots filled from that tuple.  A list, dict or set the frame built
  and also returns (or keeps at a break, or stores twice) is a slot itself
  (``note_held``): the write stores the object the caller gets, as in eager, so a later
  change through either reference reaches both.
* What is refused (a graph break, the frame runs eager as before): an owner whose class
  defines its own ``__setattr__`` or a data descriptor (a property, say) for the name,
  since replaying through them could do what the capture did not model; on an
  ``nn.Module``, replacing a parameter or a submodule, or storing a module or parameter.

* Lists, dicts and sets of the program (``registry.append(x)``, ``cache[key] = y``,
  ``config.get("a")``): the first method call or item assignment on one makes a
  *shadow* (``shadow``, called by csrc/interp_effects.c), an owned copy whose items are
  graph arguments; the capture works on the shadow from then on, and the entry writes
  its final contents back into the original (``orig[:] = ...``, or ``clear`` then
  ``update`` for a dict) at the place of the first change.  Each item read into the
  shadow is guarded; a shadow that ends as it began writes nothing.  A list the frame
  only appends to (``self.features.append(h)``) gets a *tail* instead (``tail``): an
  empty list taking the appends, extended onto the original after the graph, with only
  the original's type guarded, so a list that grows on every call does not make every
  call capture again; a later read of the list turns the tail into a full shadow in
  place (``shadow`` puts the original's items, guarded, in front).  A frame that
  returns such a container (``a.append(x); return a``, at the top of its result or
  inside tuples, lists and dicts of it) returns the object itself, as eager does:
  ``note_result`` finds the shadow's place in the result, and the replay, once the
  contents are written back, puts the original there (``_RESULT``).  So does an
  object made in the frame that holds such a container (``d = D(items);
  d.items.append(x); return d``: the rebuilt dataclass's field is ``items`` itself),
  whether the container was shadowed before the object took it or after.
"""

from __future__ import annotations

import collections
import types
import warnings
from typing import Any

from agspeed._builder_types import GraphBreak, describe_callable, holds_node
from agspeed._folds import holds_container
from agspeed._identity import plain_instance
from agspeed._logged import log_args, log_at, logging_calls, warn_args, warn_at
from agspeed._objects import _state
from agspeed._replay import (_CALL, _CONTENTS, _DICTS, _RAW_SET, _RESULT, _SET, _TAIL, _Attr,
                             _Input, _Item, _Made, _Owner, _has_slot, _same_dict, _Slot)
from agspeed._stdlib import _runs_as_missing   # a defaultdict's factories captured
from agspeed.protocol import Reason

__all__ = ["SideEffects"]

# the containers a shadow copies (csrc/interp_effects.c: their methods run no user code)
_SHADOWED = (list, *_DICTS, set)


class SideEffects:
    """The part of ``GraphBuilder`` that records effects (``effect_setattr``,
    ``replay_call``) and answers the reads that follow writes (``written``)."""

    _effects: list
    _overlay: dict
    _effect_nodes: list

    def _effects_init(self) -> None:
        self._effects = []  # (_SET, source, owner, name, template) or (_CALL, fn, a, kw)
        self._overlay = {}  # (id(owner), name) -> (owner, value): what reads now see
        self._dicts_read = {}   # id(owner) -> owner, whose __dict__ the frame was handed
        # id(program's list or dict) -> its shadow (or tail entry): the interpreter's
        # map, shared so that a store shadowed here is what its loads see
        self.shadow_map: dict = {}
        self._effect_nodes = []  # the graph nodes the templates' slots stand for
        self.replayed_calls = logging_calls()
        # id(shadow) -> (shadow, original, its items as first copied, or None: a tail)
        self._shadows: dict[int, tuple] = {}
        # id(original) -> (original, its shadow or tail)
        self._shadow_for: dict[int, tuple] = {}
        self._plan: tuple | None = None  # made once, when the capture ends
        # (path in the result, shadow or None, source or None): note_result
        self._returned_shadows: list = []
        self._put_back: set[int] = set()   # objects of the program the result holds
        self._owner_sources: list = []
        self._owners: dict = {}   # source -> its place in _owner_sources
        # id -> the capture's own list, dict or set that an effect stores as itself
        # (the result holds it too, or two writes store it): note_held
        self._held: dict[int, Any] = {}
        # id -> (object the capture made, its _Made or None while being made)
        self._made_templates: dict[int, tuple] = {}

    def effect_setattr(self, obj: Any, source: Any, name: str, value: Any,
                       raw: bool = False) -> Any:
        """Record ``obj.name = value`` (``obj`` reached by ``source``): None, or the
        class's own ``__setattr__`` written in Python, which the interpreter inlines as
        ``f(obj, name, value)`` (its ``object.__setattr__`` then comes back here
        ``raw``, the write past it, replayed the same way)."""
        if not raw:
            hook = self._setattr_hook(type(obj))
            if hook is not None:
                return hook
        self._check_writable(obj, name, value, raw)
        self._storable(value)
        self._effects.append((_RAW_SET if raw else _SET, source, obj, name, value))
        self._overlay[(id(obj), name)] = (obj, value)
        store = self._store_shadow(obj, source) \
            if self._dicts_read.get(id(obj)) is obj else None
        if store is not None:   # the frame holds its __dict__: it sees the write there
            store[name] = value
        return None

    def dict_read(self, obj: Any) -> None:
        """``obj.__dict__`` read (``obj`` an object of the program): its store as this
        capture has changed it.  The attributes set so far are made after the graph, so
        where there are any the frame gets a shadow of the store holding them, and
        every attribute set from now on goes into that shadow too."""
        self._dicts_read[id(obj)] = obj
        if any(owner is obj for owner, _value in self._overlay.values()):
            known = self.known.get(id(obj))  # type: ignore[attr-defined]
            if known is None or known[0] is not obj:
                raise GraphBreak(Reason.SIDE_EFFECT, f"the __dict__ of a "
                                 f"{type(obj).__name__} reached by no source, after "
                                 f"setting its attributes")
            self._store_shadow(obj, known[1])

    def _store_shadow(self, obj: Any, source: Any) -> Any:
        """The shadow of ``obj``'s ``__dict__`` holding the attributes set so far
        (made on first use), or None where it has no plain one."""
        store = _object_dict(obj)
        if type(store) is not dict:
            return None
        done = self._shadow_of(store)
        if done is not None:
            return done
        made = self.shadow(store, ("attr", source, "__dict__"))
        self.shadow_map[id(store)] = made
        for (_oid, name), (owner, value) in self._overlay.items():
            if owner is obj:
                made[name] = value
        return made

    def _setattr_hook(self, kind: type) -> Any:
        torch = self._torch  # type: ignore[attr-defined]
        setattr_fn = _own_setattr(kind)
        if type(setattr_fn) is types.FunctionType and \
                setattr_fn is not torch.nn.Module.__setattr__:
            return setattr_fn
        return None

    def replay_call(self, fn: Any, args: tuple, kwargs: dict) -> None:
        """Record a call of ``fn`` made for its effect; it answers None to the frame."""
        if self._ckpt_open:  # type: ignore[attr-defined]
            # eager makes it again when the backward recomputes the region
            raise GraphBreak(Reason.SIDE_EFFECT, f"{describe_callable(fn)}() inside a "
                             f"checkpointed region")
        if fn is warnings.warn:
            fn, args, kwargs = warn_at, warn_args(tuple(args), dict(kwargs)), {}
        else:
            placed = log_args(fn, tuple(args), dict(kwargs))
            if placed is not None:
                fn, args, kwargs = log_at, placed, {}
        self._effects.append((_CALL, fn, self._template(tuple(args)),
                              self._template(dict(kwargs))))

    def shadow(self, obj: Any, source: Any) -> Any:
        """An owned copy of ``obj`` (an exact list or dict reached by ``source``) whose
        items are graph arguments; its final contents are written back to ``obj``.  For
        a list with a tail, that tail, the list's items put in front of what it took."""
        done = self._shadow_of(obj)   # a tail, or one made as an item of another
        if done is not None:
            return done
        if type(obj) is list:
            made: Any = [self._shadow_item(source, k, v) for k, v in enumerate(obj)]
            first: Any = tuple(made)
        elif type(obj) is set:
            # members are hashed and compared: plain values only, the whole set guarded
            # equal to what it holds now
            for member in obj:
                if not self._is_static(member):  # type: ignore[attr-defined]
                    raise GraphBreak(Reason.SIDE_EFFECT,
                                     f"changing a set of the program holding a "
                                     f"{type(member).__name__}")
            self.assumptions.append((source, obj))  # type: ignore[attr-defined]
            made = set(obj)
            first = frozenset(obj)
        else:
            tensor = self._torch.Tensor  # type: ignore[attr-defined]
            for key in obj:
                if type(key) not in (str, int, bool, type(None)) and \
                        not isinstance(key, tensor):
                    raise GraphBreak(Reason.SIDE_EFFECT,
                                     f"changing a dict of the program keyed by "
                                     f"{type(key).__name__}")
            # a tensor key (hashed by identity) is a graph input read at its place
            # among the keys, its value at the same place among the values: the
            # shadow is keyed by its node, and the entry writes the tensor back
            items = [(self.input(("item", ("keys", source), k), key),  # type: ignore
                      self._shadow_value(("item", ("values", source), k), value))
                     if isinstance(key, tensor) else
                     (key, self._shadow_value(("item", source, key), value))
                     for k, (key, value) in enumerate(obj.items())]
            if type(obj) is collections.defaultdict:
                if not _runs_as_missing(obj.default_factory):
                    raise GraphBreak(Reason.SIDE_EFFECT,
                                     "changing a defaultdict of the program whose factory "
                                     "is neither a builtin type nor a Python function")
                self.assumptions.append(  # type: ignore[attr-defined]
                    (("attr", source, "default_factory"), obj.default_factory))
                made = collections.defaultdict(obj.default_factory, items)
            else:
                made = type(obj)(items)
            first = tuple(made.items())
        self._shadows[id(made)] = (made, obj, first)
        self._shadow_for[id(obj)] = (obj, made)
        self._effects.append((_CONTENTS, source, obj, made))
        return made

    def dict_key(self, container: Any, node: Any) -> None:
        """Store under the tensor ``node`` as a key of ``container``: taken for a shadow
        of a dict of the program and a tensor the graph is given (the entry writes the
        very tensor back, hashed by identity as in eager); a tensor the graph computes,
        a size, or a dict the capture built (which leaves it keyed by a node) breaks."""
        if not self.is_shadow(container):
            raise GraphBreak(Reason.UNSUPPORTED_VALUE, "a tensor key of a dict the capture "
                                                       "built")
        if node.op != "placeholder" or "source" not in node.meta or \
                not isinstance(node.meta.get("example_value"),
                               self._torch.Tensor):  # type: ignore[attr-defined]
            raise GraphBreak(Reason.UNSUPPORTED_VALUE, "a dict key that is a tensor the "
                                                       "graph computes")

    def tail(self, obj: Any, source: Any) -> list:
        """An empty list standing for what the frame appends to ``obj`` (an exact list
        reached by ``source``, whose items it has not read): extended onto ``obj``."""
        made: list = []
        self._shadows[id(made)] = (made, obj, None)
        self._shadow_for[id(obj)] = (obj, made)
        self._effects.append((_TAIL, source, obj, made))
        return made

    def _shadow_of(self, obj: Any) -> Any:
        """The shadow this capture made of ``obj``, or None; a tail is filled in first:
        the list is read now, so what it held matters (its length and items, guarded as a
        load of it would be), and the write-back is of its whole contents."""
        done = self._shadow_for.get(id(obj))
        if done is None or done[0] is not obj:
            return None
        made = done[1]
        if self._shadows[id(made)][2] is None:   # a tail
            at = next(k for k, e in enumerate(self._effects) if e[0] == _TAIL and e[3] is made)
            source = self._effects[at][1]
            self.assumptions.append((source, obj))  # type: ignore[attr-defined]
            # (filled from here on: a list that holds itself holds its shadow)
            self._shadows[id(made)] = (made, obj, ())
            items = [self._shadow_item(source, k, v) for k, v in enumerate(obj)]
            made[0:0] = items
            self._shadows[id(made)] = (made, obj, tuple(items))
            self._effects[at] = (_CONTENTS, source, obj, made)
        return made

    def _shadow_item(self, source: Any, key: Any, value: Any) -> Any:
        return self._shadow_value(("item", source, key), value)

    def _shadow_value(self, item: Any, value: Any) -> Any:
        """The shadow's item for ``value``, reached by ``item``: a tensor as a graph
        input, a container this capture shadows already as its shadow, anything else
        guarded."""
        if isinstance(value, self._torch.Tensor):  # type: ignore[attr-defined]
            return self.input(item, value)  # type: ignore[attr-defined]
        if type(value) in _SHADOWED:
            # a list or dict inside it that this capture changed already: its shadow
            # (a tail filled in), so that both see one object, written back as one
            done = self._shadow_of(value)
            if done is not None:
                return done
        self.assumptions.append((item, value))  # type: ignore[attr-defined]
        self.known.setdefault(id(value), (value, item))  # type: ignore[attr-defined]
        return value

    def is_shadow(self, value: Any) -> bool:
        """Whether ``value`` is the capture's copy of a list or dict of the program."""
        known = self._shadows.get(id(value))
        return known is not None and known[0] is value

    def shadow_source(self, value: Any) -> Any:
        """The source of the list or dict of the program that shadow ``value`` copies."""
        return next(e[1] for e in self._effects
                    if e[0] in (_CONTENTS, _TAIL) and e[3] is value)

    def shadow_original(self, value: Any) -> Any:
        """The list or dict of the program that shadow ``value`` stands for."""
        return self._shadows[id(value)][1]

    def written(self, obj: Any, name: str) -> tuple | None:
        """``(value,)`` when this capture wrote ``obj.name``, else None."""
        if self._dicts_read.get(id(obj)) is obj:
            store = _object_dict(obj)
            made = self._shadow_of(store) if type(store) is dict else None
            if made is not None:    # written through its __dict__, maybe
                if name in made:
                    return (made[name],)
                if name in store:
                    raise GraphBreak(Reason.SIDE_EFFECT, f"attribute {name!r} deleted "
                                     f"through the __dict__ of a {type(obj).__name__}")
                return None
        hit = self._overlay.get((id(obj), name))
        return (hit[1],) if hit is not None and hit[0] is obj else None

    @property
    def has_effects(self) -> bool:
        """Whether the entry has anything to replay (asked when the capture ends)."""
        return bool(self.effect_plan())

    @property
    def owner_sources(self) -> list:
        """The sources of the objects the replay writes to, each once, in first-write
        order: the entry reads them after the graph's inputs (asked when the capture
        ends)."""
        self.effect_plan()
        return self._owner_sources

    def effect_values(self) -> list:
        """The graph nodes the effects need, in slot order: the graph's extra outputs."""
        self.effect_plan()
        return list(self._effect_nodes)

    def effect_plan(self) -> tuple:
        """How the entry replays the effects, in order: ``(_SET, owner index, name,
        template, has slots)`` (the owner index counting in ``owner_sources``) or
        ``(_CALL, fn, args template, kwargs template, has slots)``, or ``(_CONTENTS,
        owner index, None, contents template, has slots)``, or ``(_TAIL, owner index,
        None, items template, has slots)``.  Made once, when the capture ends: the values
        written are read as they are then."""
        if self._plan is not None:
            return self._plan
        kept = [e for e in self._effects
                if e[0] not in (_CONTENTS, _TAIL) or self._changed(e[3])]
        returned = []   # (path in the result, source of the program's object there)
        for path, made, source, value in self._returned_shadows:
            returned.append((path, source if made is None else self.shadow_source(made)))
            # the graph returns None there (GraphBuilder._build_namedtuples)
            self._put_back.add(id(value))
        for effect in kept:
            if effect[0] != _CALL:
                self._owner_index(effect[1])
        for _, source in returned:
            self._owner_index(source)
        owners = self._owners
        plan = []
        for effect in kept:
            if effect[0] in (_SET, _RAW_SET):
                kind, source, _, name, value = effect
                template = self._template(value)
                plan.append((kind, owners[source], name, template, _has_slot(template)))
            elif effect[0] in (_CONTENTS, _TAIL):
                kind, source, _, made = effect
                contents = set(made) if type(made) is set else \
                    self._template(list(made) if type(made) is list else dict(made))
                plan.append((kind, owners[source], None, contents, _has_slot(contents)))
            else:
                _, fn, args, kwargs = effect
                plan.append((_CALL, fn, args, kwargs, _has_slot((args, kwargs))))
        for path, source in returned:
            # the frame returns the program's list or dict itself, contents written back
            plan.append((_RESULT, owners[source], path, None, False))
        self._plan = tuple(plan)
        return self._plan

    def note_held(self, result: Any) -> None:
        """The capture's own lists, dicts and sets that a write stores and the result
        (the frame's, or the values live at a break) holds too, or that two writes
        store: the write stores that one object, a graph output, not a copy of it.
        Asked before the plan."""
        def own(value: Any) -> bool:   # built here: no shadow, no object of the program
            return not self.is_shadow(value) and self._made_for(value) is None and \
                (not self._of_program(value) or self.is_owned(value))  # type: ignore

        def built(value: Any) -> bool:   # by the interpreter, in this capture
            return id(value) in self.owned_ids  # type: ignore[attr-defined]

        def returnable(value: Any) -> bool:   # as a graph output, all of it built here
            try:
                self.check_output(value, placed=False)  # type: ignore[attr-defined]
            except GraphBreak:
                return False
            return all(own(v) for v in self.containers_in(value))  # type: ignore

        in_result = {id(v) for v in self.containers_in(result)}  # type: ignore
        # an object the frame made, stored and also in the result: the write stores the
        # object the caller gets (both made by the graph, once)
        for value in self._made_instances(result):
            self._held[id(value)] = value
        stored: set[int] = set()
        for effect in self._effects:
            if effect[0] in (_SET, _RAW_SET):
                written, made_here = effect[4], own
            elif effect[0] in (_CONTENTS, _TAIL) and type(effect[3]) is not set:
                made = effect[3]   # the items a shadow writes back: only those the
                written = tuple(made.values() if isinstance(made, dict) else made)
                made_here = built  # capture built (not the program's, inside its tuples)
            else:
                continue
            for value in self.containers_in(written):  # type: ignore[attr-defined]
                if made_here(value) and own(value) and (id(value) in in_result or
                                   id(value) in stored and returnable(value)):
                    self._held[id(value)] = value
                stored.add(id(value))

    def note_result(self, result: Any) -> None:
        """Where the frame's result holds the capture's copy of a list or dict of the
        program (``a.append(x); return a``), or another object of the program (``return
        x, cache``, ``return self``): eager returns that very object, so the replay puts
        it there, after writing a copy's contents back.  Asked before the plan."""
        self._returned_shadows = list(self._shadow_paths(result, ()))

    def _shadow_paths(self, value: Any, path: tuple, seen: set | None = None) -> Any:
        """(path, shadow, None, it) for each list or dict of the program that ``value``
        holds and this capture copied: the shadow itself or the original (an object
        made in the frame may have taken it before the frame changed it); (path, None,
        source, it) for one it never copied but knows the source of, and for any other
        object of the program (``program_object``); through tuples, lists and dicts,
        and the attributes and items of objects the frame made."""
        seen = set() if seen is None else seen
        if id(value) in seen:
            return
        how = self.put_back_as(value)
        if how is not None:
            yield (path, *how, value)
            return
        if type(value) in (tuple, list):
            seen.add(id(value))
            for k, v in enumerate(value):
                yield from self._shadow_paths(v, path + (k,), seen)
        elif type(value) is dict:
            seen.add(id(value))
            for k, v in value.items():
                yield from self._shadow_paths(v, path + (k,), seen)
        elif self.is_owned(value) and not isinstance(value, tuple):  # type: ignore[attr-defined]
            seen.add(id(value))
            attrs, items = _state(value)
            for name, v in attrs:
                yield from self._shadow_paths(v, path + (_Attr(name),), seen)
            for key, v in items:
                yield from self._shadow_paths(v, path + (_Item(key),), seen)

    def put_back_as(self, value: Any) -> tuple | None:
        """How the entry puts ``value``, where the result holds it, back as the
        program's own object (its contents are then not the graph's): ``(shadow,
        None)`` for a list, dict or set this capture copied, ``(None, source)`` for one
        of the program's it never copied, or any other object of the program
        (``program_object``); None for a value the graph returns itself."""
        if type(value) in _SHADOWED:
            made = value if self.is_shadow(value) else self._made_for(value)
            if made is not None:
                return made, None
            known = self.known.get(id(value))  # type: ignore[attr-defined]
            if known is not None and known[0] is value and \
                    not self.is_owned(value):  # type: ignore[attr-defined]
                return None, known[1]
        if self.program_object(value):  # type: ignore[attr-defined]
            return None, self.known[id(value)][1]  # type: ignore[attr-defined]
        return None

    def _made_for(self, obj: Any) -> Any:
        """The shadow or tail this capture made of the program's ``obj``, or None."""
        done = self._shadow_for.get(id(obj))
        return done[1] if done is not None and done[0] is obj else None

    def _changed(self, made: Any) -> bool:
        first = self._shadows[id(made)][2]
        if first is None:
            return len(made) > 0   # a tail
        if type(made) is set:
            return made != first
        now = tuple(made) if type(made) is list else tuple(made.items())
        if len(now) != len(first):
            return True
        if type(made) is list:
            return any(a is not b for a, b in zip(now, first))
        return any(a[0] != b[0] or a[1] is not b[1] for a, b in zip(now, first))

    def _owner_index(self, source: Any) -> int:
        """The place of ``source`` among the owners the entry reads (added once)."""
        if source not in self._owners:
            self._owners[source] = len(self._owner_sources)
            self._owner_sources.append(source)
        return self._owners[source]

    def _template(self, value: Any) -> Any:
        """``value`` with each graph node replaced by a ``_Slot``, and each shadow, or
        list, dict or set of the program the capture holds, by the program's object
        (an ``_Owner``, read on each call: guarded by value, it need not be the object
        the capture saw)."""
        if type(value) in _SHADOWED or holds_container(value):
            if self.is_shadow(value):
                return _Owner(self._owner_index(self.shadow_source(value)))
            known = self.known.get(id(value))  # type: ignore[attr-defined]
            if known is not None and known[0] is value and \
                    not self.is_owned(value):  # type: ignore[attr-defined]
                return _Owner(self._owner_index(known[1]))
        source = self._sourced(value)
        if source is not None:
            return _Owner(self._owner_index(source))
        held = self._held.get(id(value))
        if isinstance(value, self.node_type) or held is value:  # type: ignore[attr-defined]
            self._effect_nodes.append(value)
            return _Slot(len(self._effect_nodes) - 1)
        if type(value) in (tuple, list):
            return type(value)(self._template(v) for v in value)
        if type(value) in _DICTS:
            items = {self._key_template(k): self._template(v) for k, v in value.items()}
            return _same_dict(value, items)
        if self._made_instance(value):
            return self._made_template(value)
        if hasattr(type(value), "__next__") and not self._of_program(value):  # type: ignore[attr-defined]
            # an iterator made in the frame: stored as it is, every call would get the
            # first call's, consumed
            raise GraphBreak(Reason.SIDE_EFFECT, f"storing a {type(value).__name__} made "
                             f"in the frame")
        if type(value) is not types.FunctionType and (
                self.can_escape(value) or holds_node(value, self.node_type)):  # type: ignore[attr-defined]
            # a structseq the frame made, or a namedtuple, deque or set holding graph
            # values: the graph makes it on each call, with real tensors, as eager makes
            # a new one each call
            self.check_output(value, placed=False)  # type: ignore[attr-defined]
            self._effect_nodes.append(value)
            return _Slot(len(self._effect_nodes) - 1)
        self._check_closure(value)   # (each write checks it when made; this, the rest)
        return value

    def _sourced(self, value: Any) -> Any:
        """The source of ``value`` where it is a plain instance of the program reached
        by one (a batch object passed in): a write stores it by reading it there on each
        call, so the entry need not hold, nor guard, the object the capture saw."""
        if not plain_instance(value, self._torch.nn.Module):  # type: ignore[attr-defined]
            return None
        known = self.known.get(id(value))  # type: ignore[attr-defined]
        if known is None or known[0] is not value or \
                self.is_owned(value) or self._made_instance(value):  # type: ignore[attr-defined]
            return None
        return known[1]

    def sourced_ids(self, value: Any) -> set:
        """The ids of the plain instances in ``value`` (or in the tuples, lists and
        dicts it holds) that a write stores by their sources (``_sourced``)."""
        out: set = set()
        todo, seen = [value], set()
        while todo:
            value = todo.pop()
            if id(value) in seen or len(seen) > 4096:
                continue
            seen.add(id(value))
            if type(value) in (tuple, list):
                todo.extend(value)
            elif type(value) in _DICTS:
                todo.extend(value.values())
            elif self._sourced(value) is not None:
                out.add(id(value))
        return out

    def _storable(self, value: Any) -> None:
        """Break at the write of a value the graph could not make after it (an object
        the frame made holding what no graph returns)."""
        nodes, made = len(self._effect_nodes), dict(self._made_templates)
        try:
            self._template(value)
        except GraphBreak as exc:
            raise GraphBreak(exc.reason, f"storing a {type(value).__name__} the graph "
                             f"cannot make ({exc.detail})") from exc
        finally:   # (the plan reads the values as they are when the capture ends)
            del self._effect_nodes[nodes:]
            self._made_templates = made

    def forget_effects(self) -> None:
        """Replay nothing: the capture ends in a break at its return (a value a write
        stores that the graph cannot make), and the frame runs its own code."""
        self._plan, self._owner_sources, self._owners = (), [], {}
        self._effect_nodes.clear()

    def _made_instance(self, value: Any) -> bool:
        """Whether ``value`` is an instance of a class that the capture made (no
        container, no tuple): a write stores one made anew on each call."""
        return self.is_owned(value) and not isinstance(  # type: ignore[attr-defined]
            value, (tuple, list, dict, set, frozenset, collections.deque,
                    types.FunctionType, type))

    def _made_instances(self, value: Any) -> Any:
        """The instances the capture made that ``value`` holds (itself included),
        through tuples, lists, dicts and sets and the state of the objects it made."""
        seen: set[int] = set()
        todo = [value]
        while todo:
            value = todo.pop()
            if id(value) in seen or isinstance(value, self.node_type):  # type: ignore
                continue
            seen.add(id(value))
            if isinstance(value, dict):
                todo.extend(value.values())
            elif isinstance(value, (tuple, list, set, frozenset, collections.deque)):
                todo.extend(value)
            if self._made_instance(value):
                yield value
                attrs, items = _state(value)
                todo.extend(v for _, v in attrs + items)

    def _made_template(self, value: Any) -> _Made:
        """The ``_Made`` of an object the capture made: one per object, its attributes'
        and items' templates as they are when the capture ends."""
        done = self._made_templates.get(id(value))
        if done is not None:
            if done[1] is None:
                raise GraphBreak(Reason.UNSUPPORTED_VALUE, f"storing a "
                                 f"{type(value).__name__} that holds itself")
            return done[1]
        self._made_templates[id(value)] = (value, None)
        try:
            attrs, items = _state(value)
            made = _Made(type(value), tuple((k, self._template(v)) for k, v in attrs),
                         tuple((k, self._template(v)) for k, v in items))
        except BaseException:
            del self._made_templates[id(value)]
            raise
        self._made_templates[id(value)] = (value, made)
        return made

    def _check_closure(self, value: Any) -> None:
        """A function made in the frame that closes over variables cannot leave it: its
        cells are the capture's (graph values, copies of the program's cells)."""
        if type(value) is types.FunctionType and value.__closure__ and \
                id(value) in self.owned_ids:  # type: ignore[attr-defined]
            raise GraphBreak(Reason.SIDE_EFFECT, "storing a function made in the frame "
                             "that closes over variables")

    def _key_template(self, key: Any) -> Any:
        """A dict key in a template: a graph input's node (``dict_key``) as its place
        among the graph's inputs, anything else as it is."""
        if not isinstance(key, self.node_type):  # type: ignore[attr-defined]
            return key
        for k, (node, _) in enumerate(self._inputs.values()):  # type: ignore[attr-defined]
            if node is key:
                return _Input(k)
        raise AssertionError("a dict key node that is no graph input")

    # -- what may be written ----------------------------------------------------------

    def _check_writable(self, obj: Any, name: str, value: Any, raw: bool = False) -> None:
        self._check_closure(value)
        torch = self._torch  # type: ignore[attr-defined]
        kind = type(obj)
        setattr_fn = _own_setattr(kind)
        if not raw and setattr_fn not in (object.__setattr__, torch.nn.Module.__setattr__,
                                          types.ModuleType.__setattr__):   # a global
            raise GraphBreak(Reason.SIDE_EFFECT,
                             f"setting {name!r} of a {kind.__name__}, whose class has "
                             f"its own __setattr__")
        for klass in kind.__mro__:
            found = klass.__dict__.get(name)
            if found is not None:
                if hasattr(type(found), "__set__") and \
                        type(found).__name__ != "member_descriptor":
                    raise GraphBreak(Reason.SIDE_EFFECT,
                                     f"setting {name!r} of a {kind.__name__}: a "
                                     f"{type(found).__name__} of its class")
                break
        if isinstance(obj, torch.nn.Module):
            stores = obj.__dict__
            if name in stores.get("_parameters", ()) or name in stores.get("_modules", ()) \
                    or isinstance(value, (torch.nn.Module, torch.nn.Parameter)):
                raise GraphBreak(Reason.SIDE_EFFECT,
                                 f"replacing {name!r} of a {kind.__name__} (a parameter "
                                 f"or submodule)")
            if name in stores.get("_buffers", ()) and \
                    not isinstance(value, self.node_type):  # type: ignore[attr-defined]
                raise GraphBreak(Reason.SIDE_EFFECT,
                                 f"storing a non-tensor in buffer {name!r} of a "
                                 f"{kind.__name__}")


def _own_setattr(kind: type) -> Any:
    """The ``__setattr__`` instances of ``kind`` run, past optimized-module view classes
    (which forward writes to their original's class)."""
    return next(k.__dict__["__setattr__"] for k in kind.__mro__
                if "__setattr__" in k.__dict__ and "__agspeed_view__" not in k.__dict__)


def _object_dict(obj: Any) -> Any:
    """``obj``'s own ``__dict__`` (None where it has none), read without its class's
    code."""
    try:
        return object.__getattribute__(obj, "__dict__")
    except AttributeError:
        return None
