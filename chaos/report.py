"""The drill report: report.md (verdict on its first line), report.json (the same, for machines) and
timeline.png (start lag over time with the fault windows shaded, and ownership lanes per planner).

The markdown is what a chaos engineer shows after a game day, so it leads with the verdict and why,
then the figures the issue's closing note asks for (faults per type, executions checked, duplicates,
silent misses, stale writes refused, lag outside and inside fault windows, RTO per fault type), then
the counterexamples.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from chaos.check import Verdict

__all__ = ["write_report"]

_HEAD = {"pass": "PASS", "fail": "FAIL", "invalid": "INVALID"}


def _s(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _table(head: list[str], rows: list[list[Any]]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return out


def render_markdown(v: Verdict, picture: str | None) -> str:
    m, st = v.meta, v.stats
    why = {"pass": "every invariant held and the run exercised what it was meant to",
           "fail": "invariants violated: " + ", ".join(k for k, i in v.invariants.items() if i.count),
           "invalid": "no violation, but the run cannot vouch for the system: " + "; ".join(v.invalid[:3])}[v.result]
    lines = [f"# {_HEAD[v.result]}: drill `{v.scenario}`, seed {v.seed} ({why})", ""]
    versions = ", ".join(f"{k} {x}" for k, x in sorted(m.get("versions", {}).items())) or "not recorded"
    window = (m["end_ms"] - m["start_ms"]) / 1000
    lines += [f"- seed **{v.seed}**, plan `{m.get('plan_fingerprint') or '-'}`, target {m.get('target', 'local')}",
              f"- versions: {versions}; judged by {m.get('checker', 'an unknown checker')}",
              f"- window: {window:.0f} s, {m['partitions']} partitions, lease TTL {m['lease_ttl_s']:g} s"
              + (f", cluster clock offset {m['clock_offset_ms'] / 1000:g} s" if m.get("clock_offset_ms") else ""),
              f"- exit code {v.exit_code} (0 pass, 1 fail, 3 invalid)", ""]
    if v.invalid:
        lines += ["## Why the run is invalid", "", *(f"- {r}" for r in v.invalid), ""]
    lines += ["## Invariants", ""]
    lines += _table(["", "invariant", "status", "checked", "violations"],
                    [[k, i.name, i.status.upper() if i.status == "fail" else i.status, i.checked, i.count]
                     for k, i in v.invariants.items()])
    lines += ["", "## Figures", ""]
    out = st.get("outcomes", {})
    lines += [f"- planned times checked: {st['planned_times_checked']} (ran {out.get('ran', 0)}, skipped with a "
              f"justified reason {sum(n for k, n in out.items() if k.startswith('skipped_'))}, held "
              f"{out.get('held', 0)}, pending {out.get('pending', 0)})",
              f"- effects accepted {out.get('effects_accepted', 0)}, duplicates {st['duplicates']}, silent misses "
              f"{st['silent_misses']}, stale writes refused by the sink {st['stale_writes_rejected']} "
              f"and by etcd's fence {st.get('stale_txns_refused_by_etcd', 0)}",
              f"- claims {st['claims']}, API operations {st['operations']} ({st['operations_failed']} failed)",
              f"- faults per type: {', '.join(f'{k} {n}' for k, n in st['faults_per_type'].items()) or 'none'}", ""]
    lines += ["Start lag (first accepted start - planned time; during = inside a fault window or its settle time):",
              ""]
    lines += _table(["phase", "runs", "p50 s", "p99 s", "max s"],
                    [[ph, d.get("n", 0), _s(d.get("p50_s")), _s(d.get("p99_s")), _s(d.get("max_s"))]
                     for ph, d in st["lag"].items()])
    if st["rto"]:
        lines += ["", "RTO per fault type (from the fault's start until start lag is back under its bound):", ""]
        lines += _table(["type", "faults", "min s", "median s", "max s"],
                        [[k, d["n"], _s(d["min_s"]), _s(d["median_s"]), _s(d["max_s"])] for k, d in st["rto"].items()])
    changes = st.get("region_changes") or []
    if changes:
        lines += ["", "Region policy (the planning region over the run; the first row is the one it began with):", ""]
        lines += _table(["seen at s", "planning region", "change", "from", "by", "reason"],
                        [[_s(c["t_s"], 1), c["primary"], c["kind"], c["from"] or "-", c["by"] or "-",
                          c["reason"] or "-"] for c in changes])
    if v.faults:
        lines += ["", "## Faults", ""]
        lines += _table(["#", "type", "fault", "target", "start s", "duration s", "healthy after s", "planned inside",
                         "takeovers", "stale refused", "late runs", "RTO s"],
                        [[f.index, f.type, f.name, f.target, _s(f.start_s, 1), _s(f.duration_s, 1),
                          _s(f.healthy_after_s, 1), f.planned_inside, f.takeovers, f.stale_rejected, f.late_runs,
                          _s(f.rto_s)] for f in v.faults[:300]])
        if len(v.faults) > 300:
            lines.append(f"... and {len(v.faults) - 300} more in report.json")
    bad = [(k, i) for k, i in v.invariants.items() if i.count]
    if bad:
        lines += ["", "## Counterexamples", ""]
        for k, i in bad:
            lines += [f"### {k} {i.name}: {i.count} violations", "", *(f"- `{x}`" for x in i.examples), ""]
    if picture:
        lines += ["", "## Timeline", "", f"![timeline]({picture})", ""]
    else:
        lines += ["", "(timeline.png not drawn: matplotlib is not installed; `pip install 'sched[drill]'`)", ""]
    return "\n".join(lines).rstrip() + "\n"


def draw_timeline(v: Verdict, path: Path) -> bool:
    """Start lag over time (fault windows shaded, bounds dashed) above ownership lanes per planner.
    False when matplotlib is not installed (the markdown says so)."""
    try:
        import matplotlib  # optional (the `drill` extra): only reports draw

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    m = v.meta
    t0 = m["start_ms"]
    nodes = sorted({n for _, n, _, _ in v.lanes})
    fig, (ax, lanes) = plt.subplots(2, 1, sharex=True, figsize=(13, 3.2 + 0.45 * max(2, len(nodes))),
                                    gridspec_kw={"height_ratios": [3, max(1.2, 0.45 * len(nodes))]})
    types = sorted({f.type for f in v.faults}, key=lambda k: int(k[1:]))
    colours = plt.get_cmap("tab10" if len(types) <= 10 else "tab20")
    tcol = {t: colours(i % 20) for i, t in enumerate(types)}
    end_s = (m["end_ms"] - t0) / 1000
    for f in v.faults:
        x1 = f.start_s + (f.duration_s if f.duration_s is not None else end_s - f.start_s)
        for a in (ax, lanes):
            a.axvspan(f.start_s, x1, color=tcol[f.type], alpha=0.18, lw=0)
    xs = [(p - t0) / 1000 for p, _ in v.lag_points]
    ys = [lag / 1000 for _, lag in v.lag_points]
    ax.scatter(xs, ys, s=7, color="#1f3a93", alpha=0.55, lw=0, label="start lag of one run")
    bounds = v.meta.get("lag_bounds", {})
    for key, style, label in (("steady_max_s", "--", "steady bound"), ("fault_max_s", ":", "in-fault bound")):
        if key in bounds:
            ax.axhline(bounds[key], ls=style, color="#b03a2e", lw=1, label=f"{label} {bounds[key]:g} s")
    ax.set_ylabel("start lag (s)")
    ax.set_ylim(bottom=min(0.0, min(ys, default=0.0)), top=ax.get_ylim()[1] * 1.15)  # room for the labels
    if len(v.faults) <= 40:  # name each window while there is room for the labels
        top = ax.get_ylim()[1]
        for f in v.faults:
            ax.text(f.start_s, top, f" {f.type} {f.target}", va="top", ha="left", fontsize=7, color="#333333",
                    rotation=90 if len(v.faults) > 12 else 0)
    # Region role changes: a solid line where the planning region moved, named with the region it moved to.
    for c in (v.stats.get("region_changes") or [])[1:]:
        for a in (ax, lanes):
            a.axvline(c["t_s"], color="#145a32", lw=1.4)
        ax.text(c["t_s"], ax.get_ylim()[1] * 0.55, f" {c['kind']} -> {c['primary']}", rotation=90, va="center",
                ha="right", fontsize=7, color="#145a32")
    ax.grid(alpha=0.25)
    handles, labels = ax.get_legend_handles_labels()
    import matplotlib.patches as mpatches

    for t in types:
        handles.append(mpatches.Patch(color=tcol[t], alpha=0.35))
        labels.append(f"{t} window")
    # Above the plot, right of the title: inside it would cover the windows' labels and the points.
    ax.legend(handles, labels, loc="lower right", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False,
              ncol=min(6, len(labels)), handletextpad=0.4, columnspacing=1.0, borderaxespad=0.2)
    verdict = {"pass": "PASS", "fail": "FAIL", "invalid": "INVALID"}[v.result]
    ax.set_title(f"{verdict}: drill {v.scenario}, seed {v.seed}", loc="left", fontsize=11)
    # Ownership lanes: one row per planner, partitions as thin bars within it (a takeover moves a bar).
    parts = max(1, int(m["partitions"]))
    pcol = plt.get_cmap("tab10" if parts <= 10 else "tab20")
    for row, node in enumerate(nodes):
        for p, n, a, b in v.lanes:
            if n != node:
                continue
            x0 = (a - t0) / 1000
            x1 = ((b if b is not None else m["end_ms"]) - t0) / 1000
            y = row + 0.1 + 0.8 * p / parts
            colour = pcol(p % (10 if parts <= 10 else 20))
            lanes.broken_barh([(x0, max(x1 - x0, 0.05))], (y, 0.8 / parts * 0.9), color=colour)
    if parts <= 10:  # name the partitions' colours (more would not fit; the bars still show the moves)
        keys = [mpatches.Patch(color=pcol(p)) for p in range(parts)]
        lanes.legend(keys, [f"p{p}" for p in range(parts)], loc="lower right", bbox_to_anchor=(1.0, 1.0),
                     fontsize=7, frameon=False, ncol=parts, handlelength=1.2, columnspacing=0.8, borderaxespad=0.1)
    lanes.set_yticks([r + 0.5 for r in range(len(nodes))], nodes)
    lanes.set_ylim(0, max(1, len(nodes)))
    lanes.set_xlim(left=min(0.0, min(xs, default=0.0)), right=end_s)
    lanes.set_xlabel("seconds since the run's start (harness clock)")
    lanes.set_ylabel("owner")
    lanes.set_title("partition ownership per planner (one thin bar per partition)", loc="left", fontsize=9)
    lanes.grid(axis="x", alpha=0.25)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def write_report(v: Verdict, directory: str | Path, bounds: dict[str, float] | None = None) -> dict[str, Path]:
    """Write report.md, report.json and timeline.png into `directory`; returns their paths."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    if bounds:
        v.meta["lag_bounds"] = bounds
    out = {"json": d / "report.json", "md": d / "report.md"}
    out["json"].write_text(json.dumps(v.to_json(), indent=1, default=str) + "\n")
    png = d / "timeline.png"
    drawn = draw_timeline(v, png)
    if drawn:
        out["png"] = png
    out["md"].write_text(render_markdown(v, png.name if drawn else None))
    return out
