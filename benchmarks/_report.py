"""What every benchmark script shares: the machine's description and writing results."""

from __future__ import annotations

import json
import os
import platform


def machine(device: str = "cpu") -> str:
    """CPU model, core count, OS and Python version (and the GPU's name when ``device``
    is a CUDA device), for the figures' caption."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    text = f"{model}, {os.cpu_count()} cores, {platform.system()}, Python {platform.python_version()}"
    if device.startswith("cuda"):
        import torch

        text += f", GPU {torch.cuda.get_device_name(device)}"
    return text


def sync(device: str) -> None:
    """Wait for queued device work, so that a host clock read after it is fair."""
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize(device)


def add_device_args(parser) -> None:
    """--device (cpu or cuda[:i]) and --out for a benchmark's argument parser."""
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", default=None, help="results file (default: "
                        "benchmarks/results/<name>[_cuda].json)")


def add_turn_args(parser, steps: int) -> None:
    """--warmup, --steps (per turn), --rounds, --threads and --compile-backend: the
    arguments of a benchmark whose runtimes take turns after warming up."""
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--compile-backend", default="inductor",
                        help="torch.compile's backend (the smoke test's: eager)")


def default_out(args, name: str) -> str:
    """``args.out``, or the results file of benchmark ``name`` on ``args.device``."""
    if args.out:
        return args.out
    suffix = "" if args.device == "cpu" else "_" + args.device.split(":")[0]
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                        f"{name}{suffix}.json")


def save(data: dict, path: str) -> None:
    """Write ``data`` as indented JSON to ``path`` (its folder made if missing) and say so."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(data, f, indent=2)
    print(f"  wrote {path}")
