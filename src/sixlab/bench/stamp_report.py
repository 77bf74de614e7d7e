"""The STAMP paper's figures from a run of :mod:`sixlab.bench.stamp_paper`: table and plots.

:func:`markdown` writes one table per figure (mean PDR and its 95 % confidence interval
per point, the ratios the paper reports next to the paper's own), :func:`plot_figures`
one PNG per figure, drawn like the paper's: bars for Figs 12–14, lines over the STAMP
fraction on a log scale for Figs 15–16, the generator's ceiling as a dashed line.

The paper's figures (``PAPER``) are those its text states ("High Performance Delay
Monitoring for SRv6 Based SD-WANs", §VIII): its ``basic`` Scapy implementation is
compared with sixlab's ``scapy`` plane, its ``optimized`` one (PACKET_MMAP) with
``mmap``, its eBPF one (HIKe/XDP) with ``xdp``; sixlab's ``socket`` and ``afxdp``
planes (``NO_PAPER_PLANES``) have no counterpart there.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sixlab.bench.stamp_paper import BASELINE, PaperPoint, Summary, summarize

__all__ = [
    "FIGURES",
    "NO_PAPER_PLANES",
    "PAPER",
    "PAPER_PLANES",
    "markdown",
    "paper_ratios",
    "plot_figures",
]

#: Which of the paper's implementations each sixlab plane is compared with.
PAPER_PLANES = {"scapy": "basic (Scapy)", "mmap": "optimized (PACKET_MMAP)", "xdp": "eBPF (XDP)"}

#: sixlab's planes without a counterpart in the paper.
NO_PAPER_PLANES = ("socket", "afxdp")

#: PDR at 0.5 % loss in kframes/s that the paper's text states, by (role, plane, STAMP
#: fraction). Fig 12/15 (collector) and 14: the numbers of §VIII's discussion of them.
PAPER: dict[tuple[str, str, float], float] = {
    ("collector", "scapy", 0.0): 927.8,
    ("collector", "mmap", 0.0): 924.5,
    ("collector", "xdp", 0.0): 1015.9,
    ("collector", "scapy", 0.0005): 641.3,
    ("collector", "scapy", 0.05): 20.3,
    ("collector", "xdp", 0.2): 1152.1,
    ("collector", "scapy", 1.0): 1.06,
    ("collector", "mmap", 1.0): 85.8,
    ("collector", "xdp", 1.0): 2994.9,
    ("reflector", "scapy", 1.0): 0.47,
    ("reflector", "mmap", 1.0): 35.3,
    ("reflector", "xdp", 1.0): 2179.0,
}
#: The paper's ratios to its baseline at 0 % STAMP (Figs 12, 13): its user-space
#: implementations lose 10.4 % of the forwarding rate, its eBPF one 1.6 %.
PAPER_BASELINE_RATIO = {"scapy": 1 - 0.104, "mmap": 1 - 0.104, "xdp": 1 - 0.016}

#: Figure number -> (title, role, fraction or None for the sweep).
FIGURES: dict[str, tuple[str, str | None, float | None]] = {
    "12": ("Fig 12: Session-Sender/Collector, 0 % STAMP", "collector", 0.0),
    "13": ("Fig 13: Session-Reflector, 0 % STAMP", "reflector", 0.0),
    "14": ("Fig 14: 100 % STAMP (a: collector, b: reflector)", None, 1.0),
    "15": ("Fig 15: Session-Sender/Collector over the STAMP fraction", "collector", None),
    "16": ("Fig 16: Session-Reflector over the STAMP fraction", "reflector", None),
}


def _index(summaries: Sequence[Summary]) -> dict[tuple[str, str, float], Summary]:
    return {(s.role, s.impl, s.fraction): s for s in summaries}


def _impls(summaries: Sequence[Summary]) -> list[str]:
    """Implementations in the order they first appear, the baseline first."""
    seen: list[str] = []
    for s in summaries:
        if s.impl not in seen:
            seen.append(s.impl)
    return sorted(seen, key=lambda name: (name != BASELINE, seen.index(name)))


def _fractions(summaries: Sequence[Summary], role: str) -> list[float]:
    return sorted({s.fraction for s in summaries if s.role == role})


def _kpps(s: Summary | None) -> str:
    if s is None:
        return "—"
    if s.n > 1:
        return f"{s.mean / 1e3:,.1f} ± {s.ci95 / 1e3:,.1f}"
    return f"{s.mean / 1e3:,.1f}"


def _pct(fraction: float) -> str:
    return f"{fraction * 100:g} %"


def paper_ratios(summaries: Sequence[Summary]) -> list[dict[str, Any]]:
    """The ratios the paper reports (or that follow from its figures), ours beside.

    Each row: ``what``, ``ours`` (None when a point is missing or zero), ``paper``.
    """
    idx = _index(summaries)

    def mean(role: str, impl: str, fraction: float) -> float | None:
        s = idx.get((role, impl, fraction))
        return s.mean if s is not None and s.mean > 0 else None

    def ratio(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else a / b

    rows: list[dict[str, Any]] = []
    for role, fig in (("collector", "12"), ("reflector", "13")):
        base = mean(role, BASELINE, 0.0)
        for plane, paper in PAPER_BASELINE_RATIO.items():
            rows.append({"what": f"Fig {fig}: {plane} / baseline, 0 % STAMP",
                         "ours": ratio(mean(role, plane, 0.0), base),
                         "paper": paper})  # fmt: skip
        rows += [{"what": f"Fig {fig}: {plane} / baseline, 0 % STAMP",
                  "ours": ratio(mean(role, plane, 0.0), base), "paper": None}
                 for plane in NO_PAPER_PLANES]  # fmt: skip
    for role, fig in (("collector", "14a"), ("reflector", "14b")):
        for a, b in (("xdp", "mmap"), ("mmap", "scapy"), ("xdp", "socket"), ("afxdp", "mmap")):
            pa, pb = PAPER.get((role, a, 1.0)), PAPER.get((role, b, 1.0))
            rows.append({"what": f"Fig {fig}: {a} / {b}, 100 % STAMP",
                         "ours": ratio(mean(role, a, 1.0), mean(role, b, 1.0)),
                         "paper": ratio(pa, pb)})  # fmt: skip
        base = mean(role, BASELINE, 0.0)
        pbase = PAPER[("collector", "xdp", 0.0)] / PAPER_BASELINE_RATIO["xdp"]
        rows.append({"what": f"Fig {fig}: xdp at 100 % STAMP / baseline at 0 %",
                     "ours": ratio(mean(role, "xdp", 1.0), base),
                     "paper": ratio(PAPER.get((role, "xdp", 1.0)), pbase)})  # fmt: skip
    rows += [{"what": f"Fig 14: {plane}, collector / reflector, 100 % STAMP",
              "ours": ratio(mean("collector", plane, 1.0), mean("reflector", plane, 1.0)),
              "paper": ratio(PAPER.get(("collector", plane, 1.0)),
                             PAPER.get(("reflector", plane, 1.0)))}
             for plane in PAPER_PLANES]  # fmt: skip
    return rows


def markdown(points: Sequence[PaperPoint], meta: dict[str, Any]) -> str:
    """The run as markdown: how it was made, one table per figure, the ratios."""
    summaries = summarize(points)
    idx = _index(summaries)
    impls = _impls(summaries)
    reps = max((s.n for s in summaries), default=0)
    lines = [
        "# The STAMP paper's evaluation (§VIII), rerun",
        "",
        f"    {meta.get('command', '')}",
        "",
        f"{meta.get('date', '')}, commit {meta.get('commit', '?')}; "
        f"{reps} repetition(s) per point (mean ± 95 % CI when more than one); "
        "PDR at 0.5 % loss of the total traffic, kframes/s. "
        f"Generator ceiling {_ceiling_text(meta)}. {meta.get('xdp_note', '')}.",
        "",
    ]
    if any(s.mean == 0 for s in summaries):
        lowest = (meta.get("settings") or {}).get("min_rate", "?")
        lines += [f"A PDR of 0.0: the search's lowest rate ({lowest} frames/s) already lost "
                  "more than 0.5 %.", ""]  # fmt: skip
    if meta.get("machine") is not None:
        lines += [f"Machine at the start: {meta['machine']}; at the end: "
                  f"{meta.get('machine_end')}.", ""]  # fmt: skip
    for fig, role in (("12", "collector"), ("13", "reflector")):
        lines += [f"## {FIGURES[fig][0]}", "", "| implementation | PDR | / baseline | paper PDR |"
                  " paper / baseline |", "|---|---|---|---|---|"]  # fmt: skip
        base = idx.get((role, BASELINE, 0.0))
        for impl in impls:
            s = idx.get((role, impl, 0.0))
            if s is None:
                continue
            rel = f"{s.mean / base.mean:.3f}" if base is not None and base.mean else "—"
            paper = PAPER.get((role, impl, 0.0))
            pr = PAPER_BASELINE_RATIO.get(impl)
            lines.append(f"| {impl} | {_kpps(s)} | {rel} | "
                         f"{'—' if paper is None else f'{paper:,.1f}'} | "
                         f"{'—' if pr is None else f'{pr:.3f}'} |")  # fmt: skip
        lines.append("")
    lines += [f"## {FIGURES['14'][0]}", "", "| implementation | a: collector | b: reflector |"
              " paper a | paper b |", "|---|---|---|---|---|"]  # fmt: skip
    for impl in impls:
        if impl == BASELINE:
            continue
        a, b = idx.get(("collector", impl, 1.0)), idx.get(("reflector", impl, 1.0))
        pa, pb = PAPER.get(("collector", impl, 1.0)), PAPER.get(("reflector", impl, 1.0))
        lines.append(f"| {impl} | {_kpps(a)} | {_kpps(b)} | "
                     f"{'—' if pa is None else f'{pa:,.2f}'} | "
                     f"{'—' if pb is None else f'{pb:,.2f}'} |")  # fmt: skip
    lines.append("")
    for fig, role in (("15", "collector"), ("16", "reflector")):
        fractions = _fractions(summaries, role)
        lines += [f"## {FIGURES[fig][0]}", "",
                  "| implementation | " + " | ".join(_pct(f) for f in fractions) + " |",
                  "|---|" + "---|" * len(fractions)]  # fmt: skip
        for impl in impls:
            cells = [_kpps(idx.get((role, impl, f))) for f in fractions]
            if all(c == "—" for c in cells):
                continue
            lines.append(f"| {impl} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += ["## Ratios, next to the paper's", "", "| ratio | sixlab | paper |", "|---|---|---|"]
    for row in paper_ratios(summaries):
        ours_text = "—" if row["ours"] is None else f"{row['ours']:.3g}"
        paper_text = "—" if row["paper"] is None else f"{row['paper']:.3g}"
        lines.append(f"| {row['what']} | {ours_text} | {paper_text} |")
    lines.append("")
    return "\n".join(lines)


def _ceiling_text(meta: dict[str, Any]) -> str:
    ceiling = meta.get("ceiling") or []
    if not ceiling:
        return "not measured"
    return " / ".join(f"{c / 1e3:,.0f}" for c in ceiling) + " kframes/s (start / end)"


def plot_figures(points: Sequence[PaperPoint], meta: dict[str, Any], out: Path) -> dict[str, Path]:
    """fig12.png … fig16.png in ``out``; figure number -> path."""
    import matplotlib as mpl  # noqa: PLC0415

    mpl.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    summaries = summarize(points)
    idx = _index(summaries)
    impls = _impls(summaries)
    ceiling = max(meta.get("ceiling") or [0.0]) / 1e3
    colours = {name: f"C{i}" for i, name in enumerate(impls)}
    written: dict[str, Path] = {}

    def bars(ax: Any, role: str, fraction: float, log: bool, title: str) -> None:
        names = [i for i in impls if (role, i, fraction) in idx]
        means = [idx[(role, i, fraction)].mean / 1e3 for i in names]
        errs = [idx[(role, i, fraction)].ci95 / 1e3 for i in names]
        ax.bar(range(len(names)), means, yerr=errs, capsize=4,
               color=[colours[n] for n in names])  # fmt: skip
        ax.set_xticks(range(len(names)), names)
        base = idx.get((role, BASELINE, 0.0))
        for x, (name, m) in enumerate(zip(names, means, strict=True)):
            label = f"{m:,.1f}"
            if base is not None and base.mean and fraction == 0.0 and name != BASELINE:
                label += f"\n({m * 1e3 / base.mean:.3f})"
            ax.annotate(label, (x, m), ha="center", va="bottom", fontsize=8,
                        xytext=(0, 3), textcoords="offset points")  # fmt: skip
        if ceiling:
            ax.axhline(ceiling, linestyle="--", color="grey", linewidth=1,
                       label=f"generator ceiling {ceiling:,.0f}")  # fmt: skip
            ax.legend(fontsize=8, loc="lower right")
        if log:
            ax.set_yscale("log")
        else:
            ax.set_ylim(0, max([*means, ceiling, 1.0]) * 1.15)
        ax.set_ylabel("PDR at 0.5 % loss (kframes/s)")
        ax.set_title(title, fontsize=10)
        ax.grid(visible=True, axis="y", alpha=0.3)

    for fig_no, role in (("12", "collector"), ("13", "reflector")):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        bars(ax, role, 0.0, False, FIGURES[fig_no][0] + " (ratio to baseline)")
        written[fig_no] = _save(fig, out / f"fig{fig_no}.png", plt)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    bars(axes[0], "collector", 1.0, True, "Fig 14a: Session-Sender/Collector, 100 % STAMP")
    bars(axes[1], "reflector", 1.0, True, "Fig 14b: Session-Reflector, 100 % STAMP")
    written["14"] = _save(fig, out / "fig14.png", plt)
    for fig_no, role in (("15", "collector"), ("16", "reflector")):
        fractions = _fractions(summaries, role)
        fig, ax = plt.subplots(figsize=(9, 5))
        for impl in impls:
            xs = [i for i, f in enumerate(fractions) if (role, impl, f) in idx]
            if impl == BASELINE or not xs:
                continue
            ys = [idx[(role, impl, fractions[i])].mean / 1e3 for i in xs]
            es = [idx[(role, impl, fractions[i])].ci95 / 1e3 for i in xs]
            ax.errorbar(xs, ys, yerr=es, marker="o", markersize=4, capsize=3, linewidth=1,
                        label=impl, color=colours[impl])  # fmt: skip
        base = idx.get((role, BASELINE, 0.0))
        if base is not None:
            ax.axhline(base.mean / 1e3, linestyle=":", color=colours[BASELINE], linewidth=1,
                       label=f"baseline (0 % STAMP) {base.mean / 1e3:,.0f}")  # fmt: skip
        if ceiling:
            ax.axhline(ceiling, linestyle="--", color="grey", linewidth=1,
                       label=f"generator ceiling {ceiling:,.0f}")  # fmt: skip
        ax.set_xticks(range(len(fractions)), [_pct(f) for f in fractions])
        ax.set_yscale("log")
        ax.set_xlabel("STAMP share of the traffic")
        ax.set_ylabel("PDR at 0.5 % loss (kframes/s)")
        ax.set_title(FIGURES[fig_no][0], fontsize=10)
        ax.grid(visible=True, alpha=0.3, which="both")
        ax.legend(fontsize=8)
        written[fig_no] = _save(fig, out / f"fig{fig_no}.png", plt)
    return written


def _save(fig: Any, path: Path, plt: Any) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
