"""agspeed's knowledge base from Python and from the shell.

    agspeed.cache.info()      where it is, how many graphs it knows, its size on disk
    agspeed.cache.clear()     forget every tuning result and compiled artifact
    agspeed.cache.records()   every tuned graph's record (measurements and choice)

    python -m agspeed.cache [info | list | show KEY | clear]

The knowledge base itself is ``agspeed.backends.knowledge``; its directory is
``agspeed.config.cache_dir`` (``AGSPEED_CACHE_DIR``).  ``AGSPEED_RETUNE=1`` makes the
autotuner measure again and overwrite what it finds.
"""

from __future__ import annotations

import json
import sys

from agspeed.backends import knowledge

__all__ = ["info", "clear", "records", "main"]


def info() -> dict:
    """Where the knowledge base is and what it holds."""
    return knowledge.info()


def clear() -> int:
    """Remove the tuning results and compiled artifacts; returns the bytes freed."""
    return knowledge.clear()


def records() -> list[dict]:
    """Every tuned graph's record, as stored."""
    return knowledge.records()


def main(argv: list[str] | None = None) -> int:
    """``python -m agspeed.cache``: list, show KEY, clear, info."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m agspeed.cache",
                                     description="agspeed's knowledge base (tuning "
                                                 "results and compiled artifacts)")
    sub = parser.add_subparsers(dest="command")
    sub.add_parser("list", help="one line per tuned graph")
    show = sub.add_parser("show", help="one graph's measurements (a key or its prefix)")
    show.add_argument("key")
    sub.add_parser("clear", help="remove the tuning results and compiled artifacts")
    sub.add_parser("info", help="where the cache is and what it holds")
    args = parser.parse_args(argv)
    out = sys.stdout
    if args.command in (None, "info"):
        for k, v in knowledge.info().items():
            out.write(f"{k}: {v}\n")
        return 0
    if args.command == "clear":
        out.write(f"cleared {knowledge.root()} ({knowledge.clear()} bytes)\n")
        return 0
    recs = knowledge.records()
    if args.command == "list":
        for r in recs:
            ok = {n: m for n, m in r["candidates"].items() if m["status"] == "ok"}
            won = r.get("choice") or "(tuning incomplete)"
            ratio = ok.get(r.get("choice") or "", {}).get("ratio")
            gain = f" {ratio:.2f}x" if ratio else ""
            out.write(f"{r['key']}  {won}{gain}  {r.get('graph', '?')}  "
                      f"[{', '.join(sorted(r['candidates']))}]\n")
        if not recs:
            out.write(f"no tuned graphs in {knowledge.root()}\n")
        return 0
    found = [r for r in recs if r["key"].startswith(args.key)]
    if len(found) != 1:
        out.write(f"{len(found)} records match {args.key!r}\n")
        return 1
    json.dump(found[0], out, indent=1, sort_keys=True)
    out.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
