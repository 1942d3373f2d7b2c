"""Imports inside captured code (csrc/interp_import.c): a loaded module is read from
sys.modules and guarded there; anything else breaks.  Torch-free."""

import email.errors
import email.mime
import json
import json.decoder
import json.scanner
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


def _in_package(source, package):
    ns = {"__name__": f"{package}.mod" if package else "mod", "__package__": package}
    exec(compile(source, "<rel>", "exec"), ns)
    return ns["rel"]


def test_a_relative_import_resolves_against_the_package_and_is_guarded():
    rel = _in_package("def rel(x):\n"
                      "    from .decoder import JSONDecoder\n"
                      "    from . import scanner\n"
                      "    return JSONDecoder, scanner, x\n", "json")
    out, b = capture(rel, x=T())
    assert out["status"] == "graph", out
    assert out["result"][:2] == (json.decoder.JSONDecoder, json.scanner)
    guarded = {src[2] for src, _ in b.assumptions if src[:2] == ("item", MODULES)}
    assert {"json.decoder", "json"} <= guarded
    up = _in_package("def rel(x):\n    from .. import errors\n    return errors, x\n",
                     "email.mime")
    out, b = capture(up, x=T())
    assert out["status"] == "graph" and out["result"][0] is email.errors, out


def test_a_relative_import_with_no_package_to_resolve_against_breaks():
    for package, dots in (("", "."), ("json", "..")):
        rel = _in_package(f"def rel(x):\n    from {dots} import decoder\n    return x\n",
                          package)
        out, _ = capture(rel, x=T())
        assert out["status"] == "break" and out["reason"] == Reason.UNSUPPORTED_INSTRUCTION
        assert "relative import" in out["detail"]
