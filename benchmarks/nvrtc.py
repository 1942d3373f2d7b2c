"""agspeed's fused NVRTC kernels on a GPU: memory bandwidth, graphs against inductor's
kernels and eager, and compile time from a cold cache.

1. Bandwidth: large fused kernels (a pointwise chain over 64M fp32 elements; softmax
   and layer norm rows of 1024, 4096 and 16384 columns, the ROWS kernels' warp and
   block paths, in fp32 and bf16, beside eager's), the bytes each must move over its
   median time, as a fraction of the device's peak (from its memory clock and bus width
   when torch reports them) and of what a device-to-device copy reaches.
2. Memory-bound graphs ("memory"): bias+GELU+residual, residual+LayerNorm,
   residual+RMSNorm and a scaled, masked softmax, forward and backward at sizes that
   fill the GPU (16384 x 4096 rows; 8 x 32 x 1024 x 1024 scores), fp32 and bf16,
   through eager, inductor and nvrtc: the graphs the fusion is for, where nvrtc's
   target is inductor's time.
3. Zoo ("zoo"): each zoo model's training step (forward and backward) with backends "eager",
   "inductor", "nvrtc", and, replayed as CUDA graphs, "cudagraphs" (aten's kernels) and
   "nvrtc_cudagraphs" (the fused ones), in interleaved rounds, as ratios to eager and
   nvrtc/inductor.
   Compile: the first call of each model with nvrtc from an empty kernel cache (every
   kernel compiled); "kernels s", the wall-clock seconds the slowest of its graphs
   (forward or backward) took to make its kernels (NVRTC on several threads, loads);
   NVRTC's seconds summed over those threads (JSON); how many kernels there were.
4. Compile alone ("compile", the one part that needs no GPU, and the only one run on a
   machine without one): the same models' forward and backward graphs made from an
   empty kernel cache, every kernel compiled by NVRTC to a cubin for ``--arch``
   (sm_90 by default), none loaded or run (the kernels' callables fill their outputs
   with zeros, so the step's values are not the model's); per graph, the wall-clock
   seconds its kernels took to make, on this machine's cores (partition._made compiles
   a graph's kernels on up to 8 threads).

    python benchmarks/nvrtc.py --device cuda [--quick] [--parts bandwidth,memory,zoo]
        [--out FILE]
    python benchmarks/nvrtc.py --parts compile [--arch sm_90] [--quick] [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402

import agspeed  # noqa: E402
from agspeed import _C  # noqa: E402
from _report import add_device_args, default_out, machine, save  # noqa: E402


def _events_median(fn, reps: int) -> float:
    """Median seconds of ``fn()`` on the GPU, timed with CUDA events."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def peak_bandwidth(device) -> float | None:
    """Bytes per second the memory can move in theory, when torch says its clock and
    width (double data rate)."""
    props = torch.cuda.get_device_properties(device)
    clock = getattr(props, "memory_clock_rate", None)   # kHz
    width = getattr(props, "memory_bus_width", None)    # bits
    if not clock or not width:
        return None
    return 2 * clock * 1e3 * width / 8


def bandwidth(device, quick: bool) -> list:
    from agspeed.backends.nvrtc import kernels
    from agspeed.protocol import KernelKind as KK, KernelOp as K, KernelType as T

    def op(kop, kt, *a, imm=None):
        return (kop, kt, tuple(a), imm)

    idx = torch.cuda.current_device()
    stream = torch.cuda.current_stream().cuda_stream
    rows = []
    n = (1 << 22) if quick else (1 << 26)
    x = torch.randn(n, device=device)
    out = torch.empty_like(x)
    copy = _events_median(lambda: out.copy_(x), 20)
    rows.append(("copy (torch)", 2 * n * 4, copy))
    desc = ("bw_pointwise", KK.POINTWISE, 1, 0, ((T.F32, 0),),
            (op(K.LOAD, T.F32, 0), op(K.CONST, T.F32, imm=1.5), op(K.MUL, T.F32, 0, 1),
             op(K.CONST, T.F32, imm=0.25), op(K.ADD, T.F32, 2, 3), op(K.RELU, T.F32, 4)),
            ((5, T.F32, 0),))
    k = kernels.cuda_launcher(desc, idx)
    rows.append(("pointwise fp32", 2 * n * 4, _events_median(lambda: k(stream, x, out, n), 20)))
    # the same chain on bf16 values (vectors of 8: 16 bytes a load, as fp32's 4)
    xh, outh = x.bfloat16(), out.bfloat16()
    desc_h = (desc[0] + "_bf16", KK.POINTWISE, 1, 0, ((T.BF16, 0),), desc[5],
              ((5, T.BF16, 0),))
    kh = kernels.cuda_launcher(desc_h, idx)
    rows.append(("pointwise bf16", 2 * n * 2,
                 _events_median(lambda: kh(stream, xh, outh, n), 20)))
    del xh, outh
    # rows of 1024 take the ROWS kernels' warp path (a warp a row), longer rows the block
    # path (a block a row, read again by each pass: from the cache at 4096); the same
    # element count each time
    for c in (1024, 4096, 16384):
        r = (n if not quick else 1 << 22) // c
        for storage, dtype, size in ((T.F32, torch.float32, 4), (T.BF16, torch.bfloat16, 2)):
            name = str(dtype).replace("torch.", "")
            xs = torch.randn(r, c, device=device).to(dtype)
            ys = torch.empty_like(xs)
            mx = torch.empty(r, 1, device=device)
            desc = (f"bw_softmax_{size}", KK.ROWS, 2, 1, ((storage, 0),),
                    (op(K.LOAD, T.F32, 0), op(K.AMAX, T.F32, 0), op(K.SUB, T.F32, 0, 1),
                     op(K.EXP, T.F32, 2), op(K.SUM, T.F32, 3), op(K.DIV, T.F32, 3, 4)),
                    ((5, storage, 0), (1, T.F32, 3)))
            k = kernels.cuda_launcher(desc, idx)
            t = _events_median(lambda: k(stream, xs, ys, mx, r, c), 20)
            rows.append((f"softmax {r}x{c} {name}", 2 * r * c * size, t))
            t = _events_median(lambda: torch.softmax(xs, -1), 20)
            rows.append((f"softmax {r}x{c} {name} (eager)", 2 * r * c * size, t))
            # layer norm: x read, y written, w and b (one row, in x's type, read as rows:
            # what the backend makes of a model in that type) read, mean and rstd written
            w = torch.randn(c, device=device).to(dtype)
            b = torch.randn(c, device=device).to(dtype)
            mean, rstd = torch.empty(r, 1, device=device), torch.empty(r, 1, device=device)
            desc = (f"bw_layer_norm_{size}", KK.ROWS, 2, 1,
                    ((storage, 0), (storage, 2), (storage, 2)),
                    (op(K.LOAD, T.F32, 0), op(K.SUM, T.F32, 0),
                     op(K.CONST, T.F32, imm=1.0 / c), op(K.MUL, T.F32, 1, 2),
                     op(K.SUB, T.F32, 0, 3), op(K.MUL, T.F32, 4, 4), op(K.SUM, T.F32, 5),
                     op(K.MUL, T.F32, 6, 2), op(K.CONST, T.F32, imm=1e-5),
                     op(K.ADD, T.F32, 7, 8), op(K.RSQRT, T.F32, 9), op(K.MUL, T.F32, 4, 10),
                     op(K.LOAD, T.F32, 1), op(K.MUL, T.F32, 11, 12),
                     op(K.LOAD, T.F32, 2), op(K.ADD, T.F32, 13, 14)),
                    ((15, storage, 0), (3, T.F32, 3), (10, T.F32, 3)))
            k = kernels.cuda_launcher(desc, idx)
            t = _events_median(lambda: k(stream, xs, w, b, ys, mean, rstd, r, c), 20)
            rows.append((f"layer norm {r}x{c} {name}", 2 * r * c * size, t))
            t = _events_median(lambda: torch.nn.functional.layer_norm(xs, (c,), w, b), 20)
            rows.append((f"layer norm {r}x{c} {name} (eager)", 2 * r * c * size, t))
            del xs, ys
    return rows


# --- memory-bound graphs ------------------------------------------------------------------


class _BiasGeluResidual(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.bias = torch.nn.Parameter(torch.randn(d) * 0.1)

    def forward(self, x, r):
        return torch.nn.functional.gelu(x + self.bias) + r


class _ResidualNorm(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = torch.nn.LayerNorm(d)

    def forward(self, x, r):
        return self.norm(x + r)


class _RMSNorm(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(d))

    def forward(self, x, r):
        h = x + r
        return h * torch.rsqrt(h.float().square().mean(-1, keepdim=True) + 1e-6).to(h.dtype) \
            * self.weight


class _MaskedSoftmax(torch.nn.Module):
    def __init__(self, d):
        super().__init__()

    def forward(self, x, r):
        t = x.shape[-1]
        causal = torch.ones(t, t, device=x.device, dtype=torch.bool).tril()
        return (x * 0.125 + r).masked_fill(~causal, float("-inf")).softmax(-1)


# rows of 4096 take the row kernels' block path, rows of 1024 ("rows_1k") the warp path
MEMORY_BOUND = {"bias+gelu+residual": (_BiasGeluResidual, "rows"),
                "residual+layernorm": (_ResidualNorm, "rows"),
                "residual+layernorm 1k": (_ResidualNorm, "rows_1k"),
                "residual+rmsnorm": (_RMSNorm, "rows"),
                "residual+rmsnorm 1k": (_RMSNorm, "rows_1k"),
                "scale+mask+softmax": (_MaskedSoftmax, "scores")}


def memory_bound(device, quick: bool, column_sums_ab: bool = False) -> list:
    """Graphs that are all memory traffic (no matrix product), forward and backward at
    sizes that fill the GPU: each backend's time for one step, timed with events in
    interleaved rounds.  Here nvrtc's kernels against inductor's are the comparison the
    fusion is for; the zoo's steps above are bound by launches.  ``column_sums_ab``
    adds nvrtc with its column sums off ("nvrtc_nocols": sums over the rows through
    aten), in the same rounds."""
    from agspeed.backends.nvrtc import partition

    results = []
    for dtype in (torch.float32, torch.bfloat16):
        for name, (cls, layout) in MEMORY_BOUND.items():
            gen = torch.Generator(device="cpu").manual_seed(0)
            if layout == "rows":
                shape = (1024, 1024) if quick else (16384, 4096)
            elif layout == "rows_1k":
                shape = (4096, 1024) if quick else (65536, 1024)
            else:
                shape = (8, 64, 128, 128) if quick else (8, 32, 1024, 1024)
            x = torch.randn(shape, generator=gen).to(device, dtype).requires_grad_()
            r = torch.randn(shape, generator=gen).to(device, dtype).requires_grad_()
            grad = torch.randn(shape, generator=gen).to(device, dtype)
            runs = {}
            for backend in ("eager", "inductor", "nvrtc") + \
                    (("nvrtc_nocols",) if column_sums_ab else ()):
                model = cls(shape[-1]).to(device, dtype)
                opt = agspeed.optimize(model, backend=backend.replace("_nocols", ""))

                def step(opt=opt):
                    opt(x, r).backward(grad)
                    x.grad = r.grad = None

                partition.column_sums = backend != "nvrtc_nocols"
                try:
                    step()      # compiles, forward and backward
                finally:
                    partition.column_sums = True
                runs[backend] = step
            samples = {b: [] for b in runs}
            for _ in range(3 if quick else 7):
                for backend, step in runs.items():
                    samples[backend].append(_events_median(step, 3))
            med = {b: statistics.median(v) for b, v in samples.items()}
            label = f"{name} {dtype}".replace("torch.", "")
            results.append({"graph": label, "shape": list(shape), "step_s": med})
            print(f"  {label}: " + ", ".join(f"{b} {t * 1e3:.3f} ms" for b, t in med.items()),
                  flush=True)
    return results


def _step(model, batch):
    loss = model(*batch)
    loss.backward()
    return loss


# nvrtc_cudagraphs and cudagraphs: the same graphs replayed as CUDA graphs, without the
# CPU's launch cost per kernel (with and without the fused kernels)
BACKENDS = ("eager", "inductor", "nvrtc", "cudagraphs", "nvrtc_cudagraphs")


def graphs(device, quick: bool) -> list:
    import _models
    from agspeed.backends.nvrtc import kernels

    results = []
    size = "quick" if quick else "full"
    for name in ("mlp", "resnet", "encoder", "gpt"):
        spec = _models.SPECS[name]
        batch = tuple(t.to(device) for t in spec.batch(size, torch.Generator().manual_seed(0)))
        runs = {}
        directory = os.path.join(agspeed.config.cache_dir, "nvrtc")
        compile_s = {}
        for backend in BACKENDS:
            before = len(os.listdir(directory)) if os.path.isdir(directory) else 0
            nvrtc_before = kernels.compiled["seconds"]
            graphs_before = len(kernels.compiled["graph_seconds"])
            model = _models.build(name, size, seed=0).to(device)
            opt = agspeed.optimize(model, backend=backend)
            torch.cuda.synchronize()
            start = time.perf_counter()
            _step(opt, batch)
            torch.cuda.synchronize()
            first = time.perf_counter() - start
            after = len(os.listdir(directory)) if os.path.isdir(directory) else 0
            runs[backend] = (opt, first, after - before)
            compile_s[backend] = (kernels.compiled["seconds"] - nvrtc_before,
                                  kernels.compiled["graph_seconds"][graphs_before:])
        samples = {b: [] for b in runs}
        for _ in range(5 if quick else 20):
            for backend, (opt, _, _) in runs.items():
                samples[backend].append(_events_median(lambda: _step(opt, batch), 3))
        med = {b: statistics.median(v) for b, v in samples.items()}
        results.append({"model": name, "step_s": med,
                        "first_call_s": {b: r[1] for b, r in runs.items()},
                        "nvrtc_kernels": runs["nvrtc"][2],
                        "nvrtc_compile_s_summed": compile_s["nvrtc"][0],
                        "nvrtc_graph_kernels_s": compile_s["nvrtc"][1]})
        print(f"  {name}: " + ", ".join(f"{b} {t * 1e3:.3f} ms" for b, t in med.items()),
              flush=True)
    return results


def compile_only(quick: bool, arch: str) -> list:
    """Each zoo model's graphs made with NVRTC compiling every kernel to a cubin for
    ``arch`` from the (cold) cache directory, without a GPU: per graph, the seconds its
    kernels took to make (``kernels.compiled["graph_seconds"]``), and the kernels."""
    import _models
    from agspeed.backends import nvrtc
    from agspeed.backends.nvrtc import kernels

    results = []
    size = "quick" if quick else "full"
    for name in ("mlp", "resnet", "encoder", "gpt"):
        made = []
        cold = tempfile.mkdtemp(prefix="agspeed-nvrtc-compile-")
        agspeed.config.set(cache_dir=cold)     # each model's kernels from a cold cache

        def launcher(desc):
            kernels.image_for(_C.nvrtc_source(desc), desc[0],
                              f"--gpu-architecture={arch}", True)
            made.append(desc[0])
            outputs = slice(len(desc[4]), len(desc[4]) + len(desc[6]))

            def launch(stream, *params):    # compiled, never run: outputs of zeros
                for t in params[outputs]:
                    t.zero_()

            return launch

        graphs_before = len(kernels.compiled["graph_seconds"])
        nvrtc_before = kernels.compiled["seconds"]
        spec = _models.SPECS[name]
        batch = spec.batch(size, torch.Generator().manual_seed(0))
        model = _models.build(name, size, seed=0)
        opt = agspeed.optimize(model, backend=nvrtc.compile_with(launcher))
        start = time.perf_counter()
        _step(opt, batch)
        first = time.perf_counter() - start
        graph_s = kernels.compiled["graph_seconds"][graphs_before:]
        shutil.rmtree(cold, ignore_errors=True)
        results.append({"model": name, "kernels": len(made), "sources": len(set(made)),
                         "first_call_s": first,
                        "graph_kernels_s": graph_s,
                        "nvrtc_compile_s_summed": kernels.compiled["seconds"] - nvrtc_before})
        print(f"  {name}: {len(made)} kernels, graphs' kernels made in "
              + ", ".join(f"{t:.2f}" for t in graph_s) + " s", flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_device_args(parser)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--parts", default="bandwidth,memory,zoo",
                        help="comma list: bandwidth (the kernels alone, seconds), memory "
                        "(memory-bound graphs against inductor), zoo (the zoo's steps and "
                        "compile times)")
    parser.add_argument("--column-sums-ab", action="store_true",
                        help="memory: also time nvrtc with its column sums off")
    parser.add_argument("--arch", default="sm_90",
                        help="compile: the architecture NVRTC makes cubins for")
    args = parser.parse_args()
    if args.parts == "compile":
        compile_main(args)
        return
    if not args.device.startswith("cuda"):
        parser.error("this benchmark needs --device cuda (or --parts compile alone)")
    device = torch.device(args.device)
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    torch.cuda.set_device(device)
    why = agspeed.backends.capabilities_of(agspeed.backends.get_backend("nvrtc")).unavailable()
    if why:
        sys.exit(f"nvrtc is unavailable: {why}")
    peak = peak_bandwidth(device)
    print(f"machine: {machine(args.device)}")
    print(f"peak memory bandwidth: {peak / 1e9:.0f} GB/s" if peak else "peak: not reported")
    parts = set(args.parts.split(","))
    result = {"machine": machine(args.device), "peak_bytes_per_s": peak}
    if "bandwidth" in parts:
        bw = bandwidth(device, args.quick)
        copy_rate = bw[0][1] / bw[0][2]
        print(f"{'kernel':40} {'GB/s':>8} {'of peak':>8} {'of copy':>8}")
        for name, nbytes, t in bw:
            rate = nbytes / t
            print(f"{name:40} {rate / 1e9:8.0f} {rate / peak if peak else float('nan'):8.2f} "
                  f"{rate / copy_rate:8.2f}")
        result["bandwidth"] = [{"kernel": n, "bytes": b, "seconds": t} for n, b, t in bw]
    with tempfile.TemporaryDirectory() as cold:   # every compile from a cold cache
        agspeed.config.set(cache_dir=cold)
        if "memory" in parts:
            result["memory_bound"] = memory_bound(device, args.quick, args.column_sums_ab)
            print(f"{'graph':32} {'nvrtc/eager':>12} {'inductor/eager':>15} "
                  f"{'nvrtc/inductor':>15}" + ("  no-column-sums/inductor"
                                               if args.column_sums_ab else ""))
            for r in result["memory_bound"]:
                s = r["step_s"]
                print(f"{r['graph']:32} {s['nvrtc'] / s['eager']:12.3f} "
                      f"{s['inductor'] / s['eager']:15.3f} {s['nvrtc'] / s['inductor']:15.3f}"
                      + (f"  {s['nvrtc_nocols'] / s['inductor']:23.3f}"
                         if "nvrtc_nocols" in s else ""))
        if "zoo" in parts:
            result["graphs"] = graphs(device, args.quick)
            _print_zoo(result["graphs"])
    save(result, default_out(args, "nvrtc"))


def compile_main(args) -> None:
    from agspeed.backends.nvrtc import _libs

    version, why = _libs.nvrtc()
    if version is None:
        sys.exit(f"libnvrtc is unavailable: {why}")
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    print(f"machine: {machine('cpu')}; NVRTC {version[0]}.{version[1]}, cubins for "
          f"{args.arch}")
    rows = compile_only(args.quick, args.arch)
    print(f"{'model':10} {'kernels':>8} {'sources':>8} {'slowest graph s':>16} "
          f"{'NVRTC s summed':>15}")
    for r in rows:
        print(f"{r['model']:10} {r['kernels']:8d} {r['sources']:8d} "
              f"{max(r['graph_kernels_s'], default=0.0):16.2f}"
              f" {r['nvrtc_compile_s_summed']:15.2f}")
    save({"machine": machine("cpu"), "arch": args.arch, "nvrtc_version": list(version),
          "compile": rows}, args.out or os.path.join(HERE, "results", "nvrtc_compile.json"))


def _print_zoo(rows: list) -> None:
    print(f"{'model':10} {'nvrtc/eager':>12} {'inductor/eager':>15} {'nvrtc/inductor':>15} "
          f"{'cg/eager':>9} {'nvrtc_cg/eager':>15} {'1st call s':>11} {'kernels s':>10} "
          f"{'kernels':>8}")
    for r in rows:
        s = r["step_s"]
        print(f"{r['model']:10} {s['nvrtc'] / s['eager']:12.3f} {s['inductor'] / s['eager']:15.3f} "
              f"{s['nvrtc'] / s['inductor']:15.3f} {s['cudagraphs'] / s['eager']:9.3f} "
              f"{s['nvrtc_cudagraphs'] / s['eager']:15.3f} {r['first_call_s']['nvrtc']:11.2f} "
              f"{max(r['nvrtc_graph_kernels_s'], default=0.0):10.2f} {r['nvrtc_kernels']:8d}")

if __name__ == "__main__":
    main()
