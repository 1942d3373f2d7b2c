"""Imports inside captured code (csrc/interp_import.c): a loaded module is read from
sys.modules and guarded there; anything else breaks.  Torch-free."""

import os.path
import sys

from agspeed.protocol import Reason
from test_interp import T, capture

MODULES = ("gmod", "sys", "modules")


def imports(x):
    import os
    import os.path
    import os.path as p
    from os import sep
    return os, p, sep, x


def test_loaded_modules_are_read_from_sys_modules_and_guarded():
    out, b = capture(imports, x=T())
    assert out["status"] == "graph", out
    top, sub, sep = out["result"][:3]
    assert top is os and sub is os.path and sep == os.sep
    guarded = {src[2] for src, _ in b.assumptions if src[:2] == ("item", MODULES)}
    assert {"os", "os.path"} <= guarded
    assert all(value is sys.modules[src[2]] for src, value in b.assumptions
               if src[:2] == ("item", MODULES))


def imports_unloaded(x):
    import agspeed_never_loaded_module  # noqa: F401
    return x


def test_a_module_not_loaded_yet_breaks_and_is_not_imported():
    out, _ = capture(imports_unloaded, x=T())
    assert out["status"] == "break" and out["reason"] == Reason.UNSUPPORTED_CALL
    assert "agspeed_never_loaded_module" not in sys.modules


def test_a_relative_import_breaks():
    code = compile("def rel(x):\n    from . import sibling\n    return x\n", "<rel>", "exec")
    ns = {"__name__": "pkg.mod", "__package__": "pkg"}
    exec(code, ns)
    out, _ = capture(ns["rel"], x=T())
    assert out["status"] == "break" and out["reason"] == Reason.UNSUPPORTED_INSTRUCTION
