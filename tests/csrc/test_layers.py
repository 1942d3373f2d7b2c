"""The layering of the C sources, read from their #include lines.  Torch-free.

The floor (compat.h, frame.h/.c, protocol.h/.c) includes nothing above it; guards/ stands
on the floor and on its own headers only; csrc/ reaches guards only through guards.h;
PY_VERSION_HEX is read in compat.h alone.
"""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
FLOOR_HEADERS = {"compat.h", "frame.h", "protocol.h"}
FLOOR = {"csrc/compat.h", "csrc/frame.h", "csrc/frame.c", "csrc/protocol.h",
         "csrc/protocol.c"}
GUARD_HEADERS = {p.name for p in (ROOT / "guards").glob("*.h")}


def includes(path):
    """The project headers a file includes (quoted #include lines, internal/ excluded)."""
    text = path.read_text()
    return {name for name in re.findall(r'^#\s*include\s+"([^"]+)"', text, re.M)
            if not name.startswith("internal/")}


def sources(folder, pattern="*.[ch]"):
    return sorted((ROOT / folder).glob(pattern))


def test_the_floor_includes_nothing_above_it():
    for rel in sorted(FLOOR):
        extra = includes(ROOT / rel) - FLOOR_HEADERS
        assert not extra, f"{rel} includes {extra}"


def test_guards_stand_on_the_floor_and_their_own_headers():
    assert {"guards.h"} <= GUARD_HEADERS
    for path in sources("guards"):
        extra = includes(path) - FLOOR_HEADERS - GUARD_HEADERS
        assert not extra, f"guards/{path.name} includes {extra}"


def test_csrc_reaches_guards_through_their_api_only():
    private = GUARD_HEADERS - {"guards.h"}
    for path in sources("csrc"):
        assert not includes(path) & private, f"csrc/{path.name} includes {private}"
    assert "guards.h" in includes(ROOT / "csrc" / "agspeed.h")


def test_python_versions_are_told_apart_in_one_header():
    readers = [p.relative_to(ROOT).as_posix() for p in sources("csrc") + sources("guards")
               if "PY_VERSION_HEX" in p.read_text()]
    assert readers == ["csrc/compat.h"]
