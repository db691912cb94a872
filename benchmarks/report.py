"""Turn a pytest-benchmark JSON file into a Markdown table and a PNG bar chart.

Usage: ``python benchmarks/report.py benchmarks/results/latest.json`` writes
``benchmarks/results/latest.md`` and ``benchmarks/results/latest.png``.
"""

from __future__ import annotations

import json
import platform
import sys
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def load(path: Path) -> tuple[dict, dict[str, list[dict]]]:
    doc = json.loads(path.read_text())
    groups: dict[str, list[dict]] = defaultdict(list)
    for bench in doc["benchmarks"]:
        name = bench["name"].split("[", 1)[1].rstrip("]")
        dataset = bench["group"].split("sampling-", 1)[-1].removeprefix("overhead-")
        config = name[len(dataset) + 1:] if name.startswith(dataset + "-") else name
        groups[bench["group"]].append({"config": config, **bench["extra_info"]})
    return doc.get("machine_info", {}), groups


def split_sampling(groups: dict[str, list[dict]]) -> tuple[dict[str, list[dict]], dict[str, list[dict]]]:
    """Return (the epoch groups, the sampling groups of benchmarks/test_sampling.py)."""
    sampling = {g: rows for g, rows in groups.items() if g.startswith("sampling")}
    return {g: rows for g, rows in groups.items() if g not in sampling}, sampling


def sampling_table(groups: dict[str, list[dict]]) -> str:
    """Per dataset and policy: samples/s, and the interleaved run's median epoch and policy CPU against plain."""
    lines = ["| dataset | policy | samples/s (best) | median epoch vs plain (interleaved) "
             "| policy CPU over plain, % of the fastest plain epoch |", "|---|---|---:|---:|---:|"]
    for group in sorted(g for g in groups if not g.startswith("sampling-overhead-")):
        dataset = group.removeprefix("sampling-")
        overhead = groups.get(f"sampling-overhead-{dataset}", [{}])[0]
        for r in groups[group]:
            c = r["config"]
            ratio = overhead.get(f"{c}_vs_plain")
            extra = overhead.get(f"{c}_overhead_vs_fastest_plain_epoch")
            lines.append(f"| {dataset} | {c} | {r['samples_per_s']:,.0f} | "
                         + ("" if ratio is None else f"{ratio:.3f}x") + " | "
                         + ("" if extra is None else f"{100 * extra:+.1f}%") + " |")
    return "\n".join(lines)


def best_dataloader(rows: list[dict]) -> float:
    return max((r["samples_per_s"] for r in rows if r["config"].startswith("dataloader")), default=0.0)


def _cell(row: dict, key: str, scale: float = 1.0, fmt: str = "{:,.1f}") -> str:
    return fmt.format(row[key] * scale) if key in row else ""


def table(machine: dict, groups: dict[str, list[dict]]) -> str:
    cpu = machine.get("cpu", {}).get("brand_raw", platform.processor() or "unknown CPU")
    lines = [f"Machine: {cpu}, {machine.get('cpu', {}).get('count', '?')} cores, "
             f"{machine.get('system', platform.system())} {machine.get('release', '')}; "
             f"Python {machine.get('python_version', platform.python_version())}.", ""]
    lines.append("| dataset | configuration | samples/s | MB/s | first batch (ms) | first batch, 1st round (ms) "
                 "| CPU s | peak RSS MB | peak PSS MB | vs best DataLoader | vs floor |")
    lines.append("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for group in sorted(groups):
        rows = sorted(groups[group], key=lambda r: -r["samples_per_s"])
        best = best_dataloader(rows)
        for r in rows:
            floor = r["config"].startswith("floor")
            versus = "" if floor or not best else "{:.2f}x".format(r["samples_per_s"] / best)
            cells = [_cell(r, "first_batch_s", 1e3), _cell(r, "first_batch_first_round_s", 1e3),
                     _cell(r, "cpu_s", 1, "{:.2f}"), _cell(r, "peak_rss_mb", 1, "{:,.0f}"),
                     _cell(r, "peak_pss_mb", 1, "{:,.0f}")]
            lines.append(f"| {group} | {r['config']} | {r['samples_per_s']:,.0f} | {r['mb_per_s']:,.0f} | "
                         + " | ".join(cells) + f" | {versus} | {r['ratio_to_floor']:.2f} |")
    lines += ["", "Floors: memcpy (raw data) and decode-1t (compressed data) are the denominators of "
              "'vs floor'; lmdb-lookup is shown for reference."]
    return "\n".join(lines)


def chart(groups: dict[str, list[dict]], out: Path) -> None:
    names = sorted(groups)
    configs = sorted({r["config"] for g in groups.values() for r in g if not r["config"].startswith("floor")})
    fig, axes = plt.subplots(len(names), 1, figsize=(10, 2.2 * len(names)), squeeze=False)
    for ax, name in zip(axes[:, 0], names):
        rates = {r["config"]: r["samples_per_s"] for r in groups[name]}
        shown = [c for c in configs if c in rates]
        colors = ["tab:blue" if c.startswith("fastload") else "tab:gray" for c in shown]
        ax.barh(shown, [rates[c] for c in shown], color=colors)
        ax.set_xscale("log")
        ax.set_title(name, fontsize=9, loc="left")
        ax.tick_params(labelsize=7)
        for floor, style in (("floor-memcpy", "--"), ("floor-decode-1t", ":")):
            if floor in rates:
                ax.axvline(rates[floor], color="tab:red", linestyle=style, linewidth=1, label=floor)
        ax.legend(fontsize=6, loc="lower right")
    axes[-1, 0].set_xlabel("samples/s (log scale; higher is better)")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def codec_table(groups: dict[str, list[dict]]) -> str:
    """Return the codecs benchmark (benchmarks/test_codecs.py) as one row per dataset and codec."""
    lines = ["| data | codec | ratio | conversion MB/s | native 1 thread samples/s | native 2 threads samples/s "
             "| floor samples/s (1 thread) | native 1t vs floor |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for group in sorted(g for g in groups if g.startswith("codecs-")):
        rows = {r["config"]: r for r in groups[group]}
        codecs = [c[: -len("-native-1t")] for c in rows if c.endswith("-native-1t")]
        for codec in sorted(codecs, key=lambda c: -rows[f"{c}-native-1t"]["ratio"]):
            one, two = rows[f"{codec}-native-1t"], rows.get(f"{codec}-native-2t", {})
            floor = rows.get("floor-memcpy" if codec == "raw" else f"floor-{codec}-library-1t", {})
            floor_rate = floor.get("samples_per_s", 0.0)
            versus = f"{one['samples_per_s'] / floor_rate:.2f}" if floor_rate else ""
            lines.append(f"| {group[len('codecs-'):]} | {codec} | {one['ratio']:.2f} | {one['convert_mb_s']:,.0f} | "
                         f"{one['samples_per_s']:,.0f} | {two.get('samples_per_s', 0):,.0f} | {floor_rate:,.0f} | "
                         f"{versus} |")
    lines += ["", "Floor: memcpy for raw; for a codec, its library alone over the same payloads, one thread."]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    src = Path(argv[1]) if len(argv) > 1 else Path(__file__).parent / "results" / "latest.json"
    machine, groups = load(src)
    codec_groups = {g: rows for g, rows in groups.items() if g.startswith("codecs-")}
    groups = {g: rows for g, rows in groups.items() if not g.startswith("codecs-")}
    groups, sampling = split_sampling(groups)
    text = table(machine, groups) if groups else ""
    if sampling:
        text += "\n\nSampling (benchmarks/test_sampling.py, native, 2 threads):\n\n" + sampling_table(sampling)
    if codec_groups:
        text += "\n\n" + codec_table(codec_groups)
    src.with_suffix(".md").write_text(text + "\n")
    if groups:
        chart(groups, src.with_suffix(".png"))
    print(text)
    print(f"\nwrote {src.with_suffix('.md')} and {src.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
