"""The coverage table of ``analyses/hf_coverage.py``: counts per status, non-PASS types grouped
by reason, and the README section generated from them (between :data:`BEGIN` and :data:`END`).
"""

from __future__ import annotations

import re

import pandas as pd

from attnprobe.core.display import replace_marked

STATUSES = ("PASS", "WRONG", "CRASH", "REFUSED", "NO_REFERENCE", "BUILD_FAILED", "SKIPPED")
BEGIN, END = "<!-- hf-coverage:begin -->", "<!-- hf-coverage:end -->"


def summarize(coverage: pd.DataFrame) -> pd.DataFrame:
    """Types per status, and the PASS share among types that build and have a reference."""
    counts = coverage["status"].value_counts()
    out = pd.DataFrame({"status": list(STATUSES), "count": [int(counts.get(s, 0))
                                                            for s in STATUSES]})
    checked = coverage[coverage["has_reference"].astype(bool)
                       & ~coverage["status"].isin(["BUILD_FAILED", "SKIPPED"])]
    share = (checked["status"] == "PASS").mean() if len(checked) else float("nan")
    out["share"] = out["count"] / max(len(coverage), 1)
    return pd.concat([out, pd.DataFrame([{"status": "PASS share (built, with reference)",
                                          "count": len(checked), "share": share}])],
                     ignore_index=True)


def _reason_key(reason: str) -> str:
    """A reason with what is particular to one type taken out, so types group."""
    key = re.sub(r"models/([^/]+)/(modeling|modular)_\1\.py", r"models/<type>/\2_<type>.py",
                 reason or "")
    key = re.sub(r":\d+ in ", ":<line> in ", key)
    key = re.sub(r"\b\w+(Model|Config)\b", r"<\1>", key)  # class names of one family
    return re.sub(r"max \|diff\| [0-9.e+-]+", "max |diff| <d>", key)


def reasons(coverage: pd.DataFrame) -> pd.DataFrame:
    """Non-PASS types grouped by status and reason."""
    bad = coverage[coverage["status"] != "PASS"].assign(key=lambda f: f["reason"].map(_reason_key))
    groups = bad.groupby(["status", "key"], sort=False)["model_type"].agg(list).reset_index()
    groups["count"] = groups["model_type"].map(len)
    groups["model_types"] = groups["model_type"].map(", ".join)
    return groups.rename(columns={"key": "reason"})[["status", "count", "reason", "model_types"]
                                                     ].sort_values(["status", "count"],
                                                                   ascending=[True, False])


# ------------------------------------------------------------------ README
def readme_section(coverage: pd.DataFrame, versions: str) -> str:
    """The generated part of the README section: one line per status with its types."""
    checked = coverage[coverage["has_reference"].astype(bool)
                       & ~coverage["status"].isin(["BUILD_FAILED", "SKIPPED"])]
    n_pass = int((coverage["status"] == "PASS").sum())
    n_skipped = int((coverage["status"] == "SKIPPED").sum())
    lines = [BEGIN,
             f"Measured by `python analyses/hf_coverage.py --readme` ({versions}): "
             f"{len(coverage)} model types of the text task mappings ({n_skipped} skipped); "
             f"**{n_pass} of the {len(checked)}** that build and have an eager reference "
             "pass.", "",
             "| status | types | model types |", "|---|---|---|"]
    for status in STATUSES:
        types = sorted(coverage.loc[coverage["status"] == status, "model_type"])
        if types:
            lines.append(f"| {status} | {len(types)} | {', '.join(types)} |")
    why = reasons(coverage[~coverage["status"].isin(["PASS", "SKIPPED"])])
    lines += ["", "Why the others do not pass:", ""]
    lines += [f"- {row.status} ({row.model_types}): {row.reason.split(' at attnprobe/')[0]}"
              for row in why.itertuples()]
    return "\n".join([*lines, END])


def replace_section(text: str, section: str) -> str:
    """``text`` with the span between the coverage markers (markers included) replaced."""
    return replace_marked(text, section, BEGIN, END)
