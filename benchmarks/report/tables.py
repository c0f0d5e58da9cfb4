"""Markdown tables: numbers formatted for a table, the tables the suites print and the docs
pages hold, and the lines under a table of times (noisy rows, timing notes)."""
import math

import numpy as np

from benchmarks.rounds import runner


def fmt(x, digits=3):
    """A number for a table: ``digits`` significant figures, thousands kept whole."""
    if x is None:
        return "–"
    if isinstance(x, str):
        return x
    if isinstance(x, (int, np.integer)) and not isinstance(x, bool):
        return str(int(x))
    x = float(x)
    if math.isnan(x):
        return "nan"
    if x == 0:
        return "0"
    if abs(x) >= 10 ** (digits - 1) and abs(x) < 1e7:
        return f"{x:.0f}"
    if abs(x) < 1e-3 or abs(x) >= 1e7:
        return f"{x:.{max(0, digits - 1)}e}"
    return f"{x:.{digits}g}"


def markdown_table(headers, rows, align=None):
    """A markdown table; ``align`` is a string of ``l``/``r`` per column (numbers right); a
    ``|`` inside a cell is escaped (``\\|``), as markdown asks."""
    align = align or "l" + "r" * (len(headers) - 1)
    lines = ["| " + " | ".join(headers) + " |",
             "|" + "|".join("---" if a == "l" else "---:" for a in align) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(fmt(c).replace("|", "\\|") for c in row) + " |")  # a | in a cell: \|
    return "\n".join(lines)


def settings_table(settings_dict):
    return markdown_table(["setting", "value"], [(k, str(v)) for k, v in settings_dict.items()], "ll")


def spread_cell(row):
    """A row's IQR / median for a table: ``3.1%``, with `` ⚠`` when it is flagged noisy."""
    if row.get("spread") is None:
        return "–"
    return f"{100 * row['spread']:.1f}%" + (" ⚠" if row.get("noisy") else "")


def noisy_lines(rows, name, target=None):
    """Markdown lines (none or one) naming the rows flagged noisy (``row["noisy"]``) with
    their IQR / median; ``name(row)`` names a row. torch.utils.benchmark's IQR warning, in
    the harness's words."""
    noisy = [f"{name(r)} {100 * r['spread']:.0f}%" for r in rows if r.get("noisy") and r.get("spread") is not None]
    if not noisy:
        return []
    return [f"- ⚠ **noisy** (IQR / median above {100 * (target or runner.DEFAULT_MAX_SPREAD):g}% after the rounds "
            f"allowed: the machine's load moved them, their intervals are wide): " + "; ".join(noisy)]


def timing_lines(rows, name, args):
    """The lines a suite prints after its table of times: the noisy rows
    (:func:`noisy_lines`) and each row's timing notes, ``name(row)`` naming a row."""
    lines = noisy_lines(rows, name, runner.policy_of(args).max_spread)
    return lines + [f"- {name(r)}: {n}" for r in rows for n in r["timing_notes"]]


class DocTable:
    """A table of a suite's docs page (the suite's ``DOC_TABLES``,
    :mod:`benchmarks.report.pages`): ``title``; ``rows``, the key of the run's list of row
    dicts or a function of the run that gives them; ``columns``, ``(header, cell, align)``
    each, ``cell`` a key of the row or a function of ``(row, run)`` (a missing key gives
    ``–``), ``align`` ``l`` or ``r``; ``note``, a line under the table."""

    def __init__(self, title, rows, columns, note=None):
        self.title, self.note = title, note
        self.rows = rows if callable(rows) else (lambda run, key=rows: run.get(key) or [])
        self.headers = [c[0] for c in columns]
        self.align = "".join(c[2] for c in columns)
        self._cells = [c[1] if callable(c[1]) else (lambda row, run, key=c[1]: row.get(key)) for c in columns]

    def cells(self, row, run):
        return [cell(row, run) for cell in self._cells]


def targets_doc_table():
    """The docs table of a suite whose ``targets`` are ``{name: {measured, limit,
    met_beyond_noise}}`` (a target ``measured ≤ limit``)."""
    return DocTable("Targets", lambda run: [dict(v, name=k) for k, v in (run.get("targets") or {}).items()], [
        ("target", "name", "l"), ("measured", "measured", "r"), ("≤", "limit", "r"),
        ("met", lambda row, run: "yes" if row["measured"] is not None and row["measured"] <= row["limit"] else "no",
         "l"),
        ("met beyond noise", lambda row, run: row.get("met_beyond_noise") or "–", "l")])
