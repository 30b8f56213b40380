"""The fault soak's results: per fault kind, a table, and the JSON and CSV files."""

from __future__ import annotations

import csv
import json
import statistics
from pathlib import Path
from typing import Any

from benchmarks.soak.watch import COLUMNS


def by_kind(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per fault kind: how many, recovery seconds (median, max), rounds lost."""
    table = {}
    for kind in sorted({r["kind"] for r in rows}):
        mine = [r for r in rows if r["kind"] == kind]
        times = [r["recovery_s"] for r in mine if r["recovery_s"] is not None]
        table[kind] = {
            "faults": len(mine),
            "recovered": len(times),
            "median_recovery_s": round(statistics.median(times), 1) if times else None,
            "max_recovery_s": max(times, default=None),
            "rounds_lost": sum(r["rounds_lost"] for r in mine),
        }
    return table


def kind_table(kinds: dict[str, dict[str, Any]]) -> list[str]:
    """:func:`by_kind`'s table as Markdown lines."""
    lines = ["| fault | n | recovered | median s | max s | rounds lost |", "|---" * 6 + "|"]
    for kind, row in kinds.items():
        cells = [kind, *(row[k] for k in ("faults", "recovered", "median_recovery_s"))]
        cells += [row["max_recovery_s"], row["rounds_lost"]]
        lines.append("| " + " | ".join("–" if c is None else str(c) for c in cells) + " |")
    return lines


def render(result: dict[str, Any]) -> str:
    lines = kind_table(result["by_kind"])
    final = result["final"]
    lines.append(
        f"final avg bpb {final['avg_val_bpb']:.4f}, its twin's {final['twin_avg_val_bpb']:.4f} "
        f"({final['relative_bpb_gap']:+.4%}); body rel. L2 {final['body_relative_l2']:.2e}; "
        f"{len(result['faults'])} faults in {result['wall_s']:.0f} s"
    )
    if "reference_spread" in final:
        lines.append(f"the fault-free run's spread over seeds: {final['reference_spread']:.2%}")
    broken = {k: v for k, v in result["checks"].items() if v}
    lines.append("checks: all hold" if not broken else f"checks FAILED: {json.dumps(broken)}")
    return "\n".join(lines)


def write(result: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "fault_soak.json").write_text(json.dumps(result, indent=2) + "\n")
    with (out / "inject.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(result["faults"])


def many(results: list[dict[str, Any]]) -> str:
    """Several soaks side by side (one row per soak: its seed, faults, final figure against
    its twin's, wall time, checks), then their faults pooled by kind: what a reader needs to
    see that an honest soak passes every time, not once."""
    lines = [
        "| seed | faults | kinds | final avg bpb | twin's | gap | body rel. L2 | wall s | checks |",
        "|---" * 9 + "|",
    ]
    for result in results:
        final, broken = result["final"], [k for k, v in result["checks"].items() if v]
        cells = [
            result["options"]["seed"],
            len(result["faults"]),
            len(result["by_kind"]),
            f"{final['avg_val_bpb']:.4f}",
            f"{final['twin_avg_val_bpb']:.4f}",
            f"{final['relative_bpb_gap']:+.4%}",
            f"{final['body_relative_l2']:.1e}",
            f"{result['wall_s']:.0f}",
            "hold" if not broken else "FAILED: " + ", ".join(broken),
        ]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    passed = sum(not any(r["checks"].values()) for r in results)
    lines += ["", f"{passed} of {len(results)} soaks pass every check.", ""]
    lines += kind_table(by_kind([f for r in results for f in r["faults"]]))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks.soak.report OUT...``: soaks' folders (``--out`` of each), side
    by side, as Markdown."""
    import sys

    folders = [Path(a) for a in (sys.argv[1:] if argv is None else argv)]
    if not folders:
        raise SystemExit("usage: python -m benchmarks.soak.report SOAK_OUT [SOAK_OUT ...]")
    results = [json.loads((f / "fault_soak.json").read_text()) for f in folders]
    print(many(results), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
