"""Plain-text rendering of a report (vgpu_cli.report): aligned columns, no colours, stable order."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def _align(rows: Sequence[Sequence[str]], indent: str = "") -> list[str]:
    """Left-aligned columns separated by two spaces (numbers are pre-formatted by the caller)."""
    if not rows:
        return []
    widths = [max(len(r[i]) for r in rows if i < len(r)) for i in range(max(len(r) for r in rows))]
    return [indent + "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in rows]


def _gpu_summary(gpus: list[dict[str, Any]]) -> str:
    counts: dict[str, int] = {}
    for g in gpus:
        counts[g["model"]] = counts.get(g["model"], 0) + 1
    return ", ".join(f"{n} x {m}" for m, n in counts.items()) or "no GPUs"


def _node_lines(node: dict[str, Any]) -> list[str]:
    zone = node["labels"].get("topology.kubernetes.io/zone")
    head = f"NODE {node['name']}  ({_gpu_summary(node['gpus'])}" + (f", zone {zone})" if zone else ")")
    gpu_rows: list[list[str]] = [["GPU", "MODEL", "MEMORY MiB", "", "CORES", "SHARERS"]]
    holder_rows: list[list[str]] = []
    owner: list[int] = []  # which GPU row each holder row belongs under
    for g in node["gpus"]:
        mem_pct = 100.0 * g["memoryUsedMiB"] / g["memoryMiB"]
        health = ("" if g["healthy"] else "  UNHEALTHY") + ("  CORDONED" if g.get("cordoned") else "")
        gpu_rows.append(
            [
                str(g["index"]),
                g["model"],
                f"{g['memoryUsedMiB']}/{g['memoryMiB']}",
                f"{mem_pct:5.1f}%",
                f"{g['coresUsed']}/{g['cores']}",
                f"{g['sharers']}/{g['split']}" + (health or ("  idle" if not g["holders"] else "")),
            ]
        )
        for h in g["holders"]:
            holder_rows.append(
                [
                    "-",
                    h["pod"],
                    h["container"],
                    h["role"],
                    h["model"] or "-",
                    f"{h['memoryMiB']} MiB",
                    f"{h['cores']}% SM",
                ]
            )
            owner.append(len(gpu_rows) - 1)
    gpu_lines = _align(gpu_rows, "  ")
    holder_lines = _align(holder_rows, "       ")
    lines = [head, gpu_lines[0]]
    for row in range(1, len(gpu_rows)):
        lines.append(gpu_lines[row])
        lines.extend(line for line, o in zip(holder_lines, owner, strict=True) if o == row)
    return lines


def render(report: dict[str, Any], title: str) -> str:
    """The whole report as text: placements (for a replay), nodes, totals, failures."""
    pol = report["policy"]
    lines = [f"{title}  (node policy: {pol['node']}, GPU order: {pol['gpu'] or 'from the node policy'})", ""]
    if "placed" in report:
        rows = [["#", "POD", "ROLE", "DETECTED BY", "NODE", "SCORE"]]
        for i, p in enumerate(report["placed"], 1):
            rows.append([str(i), p["pod"], p["role"], p["roleSource"], p["node"], f"{p['score']:.3f}"])
        lines += ["PLACEMENTS (in arrival order)", *_align(rows, "  "), ""]
    for node in report["nodes"]:
        lines += [*_node_lines(node), ""]
    t = report["totals"]
    lines += [
        "TOTALS",
        *_align(
            [
                ["GPUs", f"{t['gpus']} on {t['nodes']} nodes, {t['gpusInUse']} in use, {t['slices']} slices"],
                ["memory", f"{t['memoryUsedMiB']}/{t['memoryMiB']} MiB allocated ({t['memoryAllocatedPct']}%)"],
                ["SM", f"{t['coresUsed']}/{t['cores']} core-% allocated ({t['smAllocatedPct']}%)"],
                ["pods", f"{t['podsPlaced']} placed, {t['podsFailed']} failed"],
            ],
            "  ",
        ),
    ]
    if report["failed"]:
        lines += ["", "FAILED"]
        for f in report["failed"]:
            role = f" ({f['role']})" if f["role"] else ""
            lines.append(f"  {f['pod']}{role}: {f['reason']}")
            lines += _align([[f"{n}:", why] for n, why in f["nodes"].items()], "    ")
    return "\n".join(lines) + "\n"
