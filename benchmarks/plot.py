"""Plots of the cache-hit and dispatch results as SVG, with no plotting library.

Reads benchmarks/results/hit_scaling.json and dispatch.json (or the files given) and
writes docs/hit_scaling.svg and docs/dispatch.svg:

  hit_scaling  grouped bars: microseconds per call of eager, agspeed and torch.compile
               for each case, with agspeed's guard alone;
  dispatch     lines: microseconds per call against the number of cached shapes (log
               scale), agspeed and torch.compile, eager for reference.

    python benchmarks/plot.py [--hit FILE] [--dispatch FILE] [--out-dir docs]
"""

from __future__ import annotations

import argparse
import json
import math
import os
from typing import Any
from xml.sax.saxutils import escape

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
COLORS = {"eager": "#7f7f7f", "agspeed": "#1f77b4", "dynamo": "#d62728",
          "agspeed_guard": "#9ecae1", "agspeed_runtime": "#6baed6",
          "dynamo_runtime": "#fc9272"}
LABELS = {"eager": "eager", "agspeed": "agspeed", "dynamo": "torch.compile (eager backend)",
          "agspeed_guard": "agspeed guard alone",
          "agspeed_runtime": "agspeed runtime (no-op graph)",
          "dynamo_runtime": "torch.compile runtime (no-op graph)"}


class Svg:
    def __init__(self, width: int, height: int):
        self.width, self.height = width, height
        self.parts: list[str] = []

    def add(self, tag: str, text: str = "", **attrs) -> None:
        attr = " ".join(f'{k.rstrip("_").replace("_", "-")}="{v}"' for k, v in attrs.items())
        self.parts.append(f"<{tag} {attr}>{escape(text)}</{tag}>" if text else
                          f"<{tag} {attr}/>")

    def text(self, x: float, y: float, s: str, size: int = 12, anchor: str = "start",
             **attrs) -> None:
        self.add("text", s, x=f"{x:.1f}", y=f"{y:.1f}", font_size=size,
                 text_anchor=anchor, font_family="sans-serif", **attrs)

    def save(self, path: str) -> None:
        with open(path, "w") as f:
            f.write(f'<svg xmlns="http://www.w3.org/2000/svg" width="{self.width}" '
                    f'height="{self.height}" viewBox="0 0 {self.width} {self.height}">\n')
            f.write(f'<rect width="{self.width}" height="{self.height}" fill="white"/>\n')
            f.write("\n".join(self.parts))
            f.write("\n</svg>\n")
        print(f"  wrote {path}")


def _nice_max(value: float) -> float:
    """A round axis top at or above ``value``."""
    if value <= 0:
        return 1.0
    step = 10 ** math.floor(math.log10(value))
    for m in (1, 2, 2.5, 5, 10):
        if m * step >= value:
            return m * step
    return 10 * step


def y_grid(svg: "Svg", left: float, width: float, y_of: Any, hi: float,
           unit: str) -> None:
    """Five horizontal grid lines from 0 to ``hi``, labelled in ``unit`` on the left."""
    for k in range(5):
        v = hi * k / 4
        svg.add("line", x1=left, x2=left + width, y1=f"{y_of(v):.1f}", y2=f"{y_of(v):.1f}",
                stroke="#ddd")
        svg.text(left - 6, y_of(v) + 4, f"{v:g}{unit}", size=10, anchor="end")


def _legend(svg: Svg, keys: list[str], x: float, y: float) -> None:
    for i, key in enumerate(keys):
        svg.add("rect", x=x, y=y + 16 * i - 9, width=10, height=10, fill=COLORS[key])
        svg.text(x + 15, y + 16 * i, LABELS[key], size=11)


def plot_hit_scaling(data: dict, path: str) -> None:
    cases = list(data["cases"])
    series = [k for k in ("eager", "agspeed", "dynamo", "agspeed_guard", "agspeed_runtime",
                          "dynamo_runtime")
              if all(f"{k}_us" in data["cases"][c] for c in cases)]
    w, h, left, top, bottom = 880, 380, 60, 50, 60
    svg = Svg(w, h)
    svg.text(w / 2, 22, f"Cache-hit cost per call ({data.get('device', 'cpu')}), log scale",
             size=14, anchor="middle")
    svg.text(w / 2, 38, data["machine"] + f", torch {data['torch']}", size=10,
             anchor="middle", fill="#555")
    values = [data["cases"][c][f"{s}_us"] for c in cases for s in series]
    lo = 10 ** math.floor(math.log10(min(v for v in values if v > 0)))
    hi = _nice_max(max(values))
    plot_h, plot_w = h - top - bottom, w - left - 200

    def y_of(v: float) -> float:
        return top + plot_h * (1 - (math.log10(max(v, lo)) - math.log10(lo))
                               / (math.log10(hi) - math.log10(lo)))

    decade = lo
    while decade <= hi:
        y = y_of(decade)
        svg.add("line", x1=left, x2=left + plot_w, y1=f"{y:.1f}", y2=f"{y:.1f}",
                stroke="#ddd")
        svg.text(left - 6, y + 4, f"{decade:g} us", size=10, anchor="end")
        decade *= 10
    group = plot_w / len(cases)
    bar = group * 0.8 / len(series)
    for i, case in enumerate(cases):
        x0 = left + group * i + group * 0.1
        for j, s in enumerate(series):
            v = data["cases"][case][f"{s}_us"]
            y = y_of(v)
            svg.add("rect", x=f"{x0 + bar * j:.1f}", y=f"{y:.1f}", width=f"{bar - 1:.1f}",
                    height=f"{top + plot_h - y:.1f}", fill=COLORS[s])
        svg.text(left + group * (i + 0.5), top + plot_h + 16, case.replace("_", " "),
                 size=11, anchor="middle")
    summary = data.get("summary", {})
    if "runtime_100_vs_1_layers" in summary:
        svg.text(left, h - 14, "100 layers / 1 layer: agspeed runtime "
                 f"{summary['runtime_100_vs_1_layers']:.1f}x, its guard "
                 f"{summary['guard_100_vs_1_layers']:.1f}x; torch.compile runtime "
                 f"{summary['dynamo_runtime_100_vs_1_layers']:.1f}x", size=11)
    elif "guard_100_vs_1_layers" in summary:
        svg.text(left, h - 14, "agspeed guard, 100 layers / 1 layer: "
                 f"{summary['guard_100_vs_1_layers']:.1f}x", size=11)
    _legend(svg, series, left + plot_w + 20, top + 10)
    svg.save(path)


def plot_dispatch(data: dict, path: str) -> None:
    rows = {int(n): r for n, r in data["rows"].items()}
    ns = sorted(rows)
    series = ["eager", "agspeed", "dynamo"]
    w, h, left, top, bottom = 760, 360, 60, 50, 50
    svg = Svg(w, h)
    svg.text(w / 2, 22, f"Dispatch among N cached shapes of one function "
             f"({data.get('device', 'cpu')})", size=14, anchor="middle")
    svg.text(w / 2, 38, data["machine"] + f", torch {data['torch']}", size=10,
             anchor="middle", fill="#555")
    values = [rows[n][f"{s}_us"] for n in ns for s in series if rows[n].get(f"{s}_us")]
    hi = _nice_max(max(values))
    plot_h, plot_w = h - top - bottom, w - left - 200
    span = math.log10(ns[-1]) - math.log10(ns[0]) or 1.0

    def x_of(n: int) -> float:
        return left + plot_w * (math.log10(n) - math.log10(ns[0])) / span

    def y_of(v: float) -> float:
        return top + plot_h * (1 - v / hi)

    y_grid(svg, left, plot_w, y_of, hi, " us")
    for n in ns:
        svg.text(x_of(n), top + plot_h + 16, str(n), size=11, anchor="middle")
    svg.text(left + plot_w / 2, h - 8, "cached shapes (log scale)", size=11, anchor="middle")
    for s in series:
        pts = [(x_of(n), y_of(rows[n][f"{s}_us"])) for n in ns if rows[n].get(f"{s}_us")]
        if len(pts) > 1:
            svg.add("polyline", points=" ".join(f"{x:.1f},{y:.1f}" for x, y in pts),
                    fill="none", stroke=COLORS[s], stroke_width=2)
        for x, y in pts:
            svg.add("circle", cx=f"{x:.1f}", cy=f"{y:.1f}", r=3, fill=COLORS[s])
    _legend(svg, series, left + plot_w + 20, top + 10)
    svg.save(path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hit", default=os.path.join(HERE, "results", "hit_scaling.json"))
    parser.add_argument("--dispatch", default=os.path.join(HERE, "results", "dispatch.json"))
    parser.add_argument("--out-dir", default=os.path.join(ROOT, "docs"))
    parser.add_argument("--suffix", default="")
    args = parser.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    with open(args.hit) as f:
        plot_hit_scaling(json.load(f), os.path.join(args.out_dir,
                                                    f"hit_scaling{args.suffix}.svg"))
    with open(args.dispatch) as f:
        plot_dispatch(json.load(f), os.path.join(args.out_dir, f"dispatch{args.suffix}.svg"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
