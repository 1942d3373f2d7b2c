"""Instructions per cache hit, counted by callgrind: a figure that does not depend on noise.

Each case is run twice under ``valgrind --tool=callgrind``, once with N1 and once with N2
cache hits after the same warm-up (which captures and compiles), collecting only inside
one C function (``--toggle-collect``), the cyclic GC off during the hits and string
hashing fixed (``PYTHONHASHSEED=0``), so both runs do the same warm-up work.  The difference
divided by N2 - N1 is what one hit costs there, warm-up excluded:

  ags_eval           the whole hit: the hook, the lookup, gathering the inputs, calling
                     the graph (a no-op backend: its graph returns its first input);
  ags_cache_lookup   finding the entry: signature or argument check, guard program.

Cases: ``inputs_4`` (a function of 4 tensors) and ``layers_8`` (a ModuleList of 8 Linear
layers, whose guard checks parameters).  Needs valgrind.

    python benchmarks/hit_instructions.py [--out FILE]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
FUNCTIONS = ("ags_eval", "ags_cache_lookup")
N1, N2 = 200, 5200


def _child(case: str, n: int) -> None:
    """The program valgrind runs: warm up, then ``n`` hits."""
    import torch

    import agspeed

    torch.set_num_threads(1)

    def noop(gm, example_inputs):
        return lambda *args: args[0]

    def add4(a, b, c, d):
        return a + b + c + d

    if case == "inputs_4":
        fn = agspeed.optimize(add4, backend=noop)
        args = [torch.randn(4) for _ in range(4)]
    else:
        class Stack(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.layers = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(8))

            def forward(self, x):
                for layer in self.layers:
                    x = layer(x)
                return x

        fn = agspeed.optimize(Stack().eval(), backend=noop)
        args = [torch.randn(2, 8)]
    with torch.no_grad():
        for _ in range(20):
            fn(*args)
        gc.collect()
        gc.disable()   # no collection lands inside a counted hit
        for _ in range(n):
            fn(*args)


def _count(case: str, n: int, function: str) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "cg.out")
        subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
                        f"--toggle-collect={function}", sys.executable, __file__,
                        "--child", case, str(n)], check=True, capture_output=True,
                       env=dict(os.environ, PYTHONHASHSEED="0"))
        with open(out) as f:
            text = f.read()
    found = re.search(r"^(?:summary|totals):\s+(\d+)", text, re.M)
    return int(found.group(1)) if found else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None)
    parser.add_argument("--cases", default="inputs_4,layers_8")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.child[0], int(args.child[1]))
        return
    rows = {}
    cases = args.cases.split(",")
    for case in cases:
        for function in FUNCTIONS:
            per_hit = (_count(case, N2, function) - _count(case, N1, function)) / (N2 - N1)
            rows[f"{case}/{function}"] = round(per_hit)
            print(f"{case:10s} {function:18s} {per_hit:10.0f} instructions per hit", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
