"""Results of the benchmark groups: rows, targets, the printed tables, latest.json, the plot.

A :class:`Row` holds one contender's per-round samples (ns per call) and how to read it:
``ref`` names the row its *ratio* is taken against (per round, then the median), ``peer`` the
row of the *vs* column (ortagent against onnxruntime or the 1.19.2 agent). ``speedup`` rows
(threads) show ``ref / self`` (throughput) instead of ``self / ref``.
A :class:`Target` is one of the project's performance targets (benchmarks/README.md), evaluated on the same run: PASS, MISS, or n/a
when its contenders could not run here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ._harness import paired, quartiles, summary


@dataclass
class Row:
    key: str
    label: str
    side: str
    samples: list[float]                    # ns per call, one per round
    ref: str | None = None
    peer: str | None = None
    speedup: bool = False
    unit: str = "us"                        # "us" or "ms"
    note: str = ""
    ref_name: str | None = None             # how the ratio column names ref (default: its label)
    peer_name: str | None = None            # how the vs column names peer
    other: list[float] | None = None        # the same bursts by the other clock

    @property
    def scale(self) -> float:
        return 1e3 if self.unit == "us" else 1e6


@dataclass
class Target:
    id: str
    text: str                               # e.g. "ortagent run <= 1.3x C Run (Identity)"
    value: float | None
    limit: float
    op: str                                 # "<=" or ">="
    unit: str                               # "x", "us", "ms"
    spread: tuple[float, float] | None = None  # q1, q3 of the per-round values
    detail: str = ""
    status: str = ""
    key: str | None = None                  # the row and reference row of a ratio target
    ref: str | None = None

    def __post_init__(self) -> None:
        if not self.status:
            if self.value is None or (isinstance(self.value, float) and math.isnan(self.value)):
                self.status = "n/a"
            elif self.op == "<=":
                self.status = "PASS" if self.value <= self.limit else "MISS"
            else:
                self.status = "PASS" if self.value >= self.limit else "MISS"

    def line(self) -> str:
        if self.value is None:
            shown = "not measured"
        else:
            shown = _fmt(self.value, self.unit)
            if self.spread:
                shown += f" (q1-q3 {_fmt(self.spread[0], self.unit)}-{_fmt(self.spread[1], self.unit)})"
        text = f"{self.status:<4}  {self.text}: {shown}"
        return text + (f"; {self.detail}" if self.detail else "")

    def as_json(self) -> dict:
        return {"id": self.id, "text": self.text, "status": self.status, "value": self.value,
                "limit": self.limit, "op": self.op, "unit": self.unit,
                "spread": list(self.spread) if self.spread else None, "detail": self.detail,
                "row": self.key, "ref_row": self.ref}


def _fmt(value: float, unit: str) -> str:
    if unit == "x":
        return f"{value:.2f}x"
    if unit == "bool":
        return "yes" if value else "no"
    digits = 3 if abs(value) < 10 else 2 if abs(value) < 100 else 1
    return f"{value:.{digits}f} {'µs' if unit == 'us' else unit}"


@dataclass
class Group:
    name: str
    title: str
    rows: list[Row] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    rounds: int = 0
    burst_s: float = 0.0
    seconds: float = 0.0
    skipped: str = ""
    clock: str = "wall"                     # which clock the samples are ("wall" or "cpu")
    load: tuple[float, float] | None = None    # 1-minute load average before and after

    def row(self, key: str) -> Row | None:
        return next((r for r in self.rows if r.key == key), None)

    def samples(self, key: str) -> list[float] | None:
        row = self.row(key)
        return row.samples if row else None

    def ratio(self, key: str, ref: str, speedup: bool = False) -> list[float] | None:
        a, b = self.samples(key), self.samples(ref)
        if a is None or b is None:
            return None
        return paired(b, a) if speedup else paired(a, b)

    def ratio_target(self, id: str, text: str, key: str, ref: str, limit: float, op: str = "<=",
                     speedup: bool = False, detail: str = "") -> Target:
        values = self.ratio(key, ref, speedup)
        if values is None:
            target = Target(id, text, None, limit, op, "x", detail=detail or "not measured here",
                            key=key, ref=ref)
        else:
            q1, med, q3 = quartiles(values)
            target = Target(id, text, med, limit, op, "x", (q1, q3), detail, key=key, ref=ref)
        self.targets.append(target)
        return target

    # -- output --------------------------------------------------------------------------------

    def row_json(self, row: Row) -> dict:
        stats = summary(row.samples)
        out = {"key": row.key, "label": row.label, "side": row.side, "unit": row.unit,
               "note": row.note,
               **{f"{k}_{row.unit}": v / row.scale for k, v in stats.items() if k != "n"},
               f"samples_{row.unit}": [round(v / row.scale, 4) for v in row.samples]}
        if row.other is not None and row.other != row.samples:
            other = "wall" if self.clock == "cpu" else "cpu"
            out[f"{other}_clock"] = {
                f"median_{row.unit}": summary(row.other)["median"] / row.scale,
                f"samples_{row.unit}": [round(v / row.scale, 4) for v in row.other]}
        for kind, other in (("ratio", row.ref), ("vs", row.peer)):
            if other is None:
                continue
            values = self.ratio(row.key, other, row.speedup and kind == "ratio")
            q1, med, q3 = quartiles(values)
            name = row.ref_name if kind == "ratio" else row.peer_name
            out[kind] = {"to": other, "to_label": name or _short(self.row(other).label),
                         "median": med, "q1": q1, "q3": q3,
                         "speedup": row.speedup and kind == "ratio"}
        return out

    def as_json(self) -> dict:
        return {"name": self.name, "title": self.title, "rounds": self.rounds,
                "clock": self.clock,
                "burst_s": self.burst_s, "seconds": round(self.seconds, 1),
                "skipped": self.skipped or None, "notes": self.notes,
                "load_average": list(self.load) if self.load else None,
                "rows": [self.row_json(r) for r in self.rows],
                "targets": [t.as_json() for t in self.targets]}

    def table(self) -> str:
        lines = [f"== {self.title} =="]
        if self.skipped:
            lines.append(f"  skipped: {self.skipped}")
            return "\n".join(lines)
        clock = "thread CPU time" if self.clock == "cpu" else "wall clock"
        lines.append(f"   median of {self.rounds} rounds, bursts of ~{self.burst_s * 1e3:.0f} ms, "
                     f"{clock}; spread = q1-q3 over rounds; ratios paired per round"
                     if self.burst_s else
                     f"   median of {self.rounds} rounds, {clock}; spread = q1-q3 over rounds")
        if self.load:
            lines.append(f"   load average (1 min) {self.load[0]:.2f} before, {self.load[1]:.2f} "
                         f"after; {self.seconds:.0f} s")
        header = ["benchmark", "median", "q1-q3", "ratio", "vs"]
        body = []
        for row in self.rows:
            data = self.row_json(row)
            u = row.unit
            unit_name = "µs" if u == "us" else u
            cells = [row.label,
                     f"{data[f'median_{u}']:.3f} {unit_name}" if data[f"median_{u}"] < 10
                     else f"{data[f'median_{u}']:.1f} {unit_name}",
                     f"{data[f'q1_{u}']:.3f}-{data[f'q3_{u}']:.3f}" if data[f"q3_{u}"] < 10
                     else f"{data[f'q1_{u}']:.1f}-{data[f'q3_{u}']:.1f}"]
            for kind in ("ratio", "vs"):
                r = data.get(kind)
                if r is None:
                    cells.append("")
                elif r["speedup"]:
                    cells.append(f"{r['median']:.2f}x throughput of {r['to_label']}")
                else:
                    cells.append(f"{r['median']:.2f}x {r['to_label']}")
            body.append(cells)
        widths = [max(len(str(c[i])) for c in [header, *body]) for i in range(len(header))]
        fmt = "  ".join(f"{{:<{w}}}" if i in (0, 3, 4) else f"{{:>{w}}}" for i, w in enumerate(widths))
        lines.append("  " + fmt.format(*header).rstrip())
        lines.append("  " + "  ".join("-" * w for w in widths))
        for cells in body:
            lines.append("  " + fmt.format(*cells).rstrip())
        if self.targets:
            lines.append("  targets:")
            lines.extend(f"    {t.line()}" for t in self.targets)
        for note in self.notes:
            lines.append(f"  note: {note}")
        return "\n".join(lines)


def _short(label: str) -> str:
    """The part of a label after its model/size prefix (``identity: C Run`` -> ``C Run``)."""
    return label.split(": ", 1)[-1]


def markdown_table(group: Group) -> str:
    """The group as a Markdown table (for benchmarks/README.md)."""
    if group.skipped:
        return f"*skipped: {group.skipped}*\n"
    out = ["| benchmark | median | q1-q3 | ratio | vs |", "| --- | ---: | ---: | --- | --- |"]
    for row in group.rows:
        data = group.row_json(row)
        u = row.unit
        unit_name = "µs" if u == "us" else u
        med, q1, q3 = data[f"median_{u}"], data[f"q1_{u}"], data[f"q3_{u}"]
        digits = 3 if med < 10 else 1
        cells = [row.label, f"{med:.{digits}f} {unit_name}", f"{q1:.{digits}f}-{q3:.{digits}f}"]
        for kind in ("ratio", "vs"):
            r = data.get(kind)
            if r is None:
                cells.append("")
            elif r["speedup"]:
                cells.append(f"{r['median']:.2f}x throughput of {r['to_label']}")
            else:
                cells.append(f"{r['median']:.2f}x {r['to_label']}")
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def markdown(groups: list[Group], targets: list[Target], header: str) -> str:
    """All tables and targets as Markdown."""
    out = [header, ""]
    for group in groups:
        out.append(f"#### {group.title}")
        out.append("")
        out.append(markdown_table(group))
        if group.targets:
            out.extend(f"- **{t.status}** {t.line()[6:]}" for t in group.targets)
            out.append("")
        out.extend(f"- note: {n}" for n in group.notes)
        out.append("")
    counts = {s: sum(t.status == s for t in targets) for s in ("PASS", "MISS", "n/a")}
    out.append(f"Targets: {counts['PASS']} PASS, {counts['MISS']} MISS, {counts['n/a']} n/a.")
    return "\n".join(out) + "\n"


def plot(groups: list[Group], targets: list[Target], path, title: str) -> None:
    """Bars of each row's ratio (to its ref), one panel per group; targets' limits as marks."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, NullFormatter

    panels = [g for g in groups if not g.skipped and any(r.ref for r in g.rows)]
    if not panels:
        return
    heights = [max(1.5, 0.28 * sum(1 for r in g.rows if r.ref) + 0.9) for g in panels]
    fig, axes = plt.subplots(len(panels), 1, figsize=(11, sum(heights) + 0.6),
                             gridspec_kw={"height_ratios": heights}, squeeze=False)
    colours = {"C": "#7f7f7f", "ortagent": "#1f77b4", "onnxruntime": "#ff7f0e",
               "ort-training 1.19.2": "#2ca02c", "harness": "#bcbd22"}
    for ax, group in zip(axes[:, 0], panels):
        rows = [r for r in group.rows if r.ref]
        labels, values, lows, highs, cols = [], [], [], [], []
        for row in rows:
            q1, med, q3 = quartiles(group.ratio(row.key, row.ref, row.speedup))
            to = row.ref_name or _short(group.row(row.ref).label)
            labels.append(f"{row.label}  ({'throughput vs ' if row.speedup else 'vs '}{to})")
            values.append(med)
            lows.append(med - q1)
            highs.append(q3 - med)
            cols.append(colours.get(row.side, "#9467bd"))
        y = list(range(len(rows)))[::-1]
        ax.barh(y, values, xerr=[lows, highs], color=cols, height=0.7, capsize=2)
        ax.axvline(1.0, color="black", linewidth=0.8)
        ax.set_yticks(y)
        ax.set_yticklabels(labels, fontsize=7)
        limits = [t.limit for t in targets if t.unit == "x" and any(t.key == r.key for r in rows)]
        span = [v for v in values + limits if v > 0]
        if span and max(span) / min(span) > 12:
            ax.set_xscale("log")
            ax.xaxis.set_minor_formatter(NullFormatter())
        else:
            ax.set_xlim(0, max(span + [1.0]) * 1.25)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
        ax.set_title(group.title, fontsize=9, loc="left")
        ax.tick_params(axis="x", labelsize=7)
        for yy, v in zip(y, values):
            ax.text(v, yy, f" {v:.2f}x", va="center", fontsize=6)
        # each target's limit as a red mark across its bar
        for yy, row in zip(y, rows):
            for t in targets:
                if t.key == row.key and t.ref == row.ref and t.unit == "x":
                    ax.plot([t.limit, t.limit], [yy - 0.45, yy + 0.45], color="red", linewidth=1.5)
                    ax.text(t.limit, yy + 0.45, f"{t.status} ", fontsize=5, color="red",
                            ha="right", va="bottom")
    fig.suptitle(title, fontsize=8)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.35 / (sum(heights) + 0.6)))
    fig.savefig(path, dpi=90)
    plt.close(fig)
