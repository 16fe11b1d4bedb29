"""Tokens spent on model calls: what a job records, by "provider/model", as the provider's
server counted them (GET /api/memory/jobs/{id}, and bench.write_pipeline_model's cost)."""

from __future__ import annotations

Usage = dict[str, dict[str, int]]  # "provider/model" -> {"calls", "in", "out"}


def usage_of(*answers) -> Usage:
    """Tokens by "provider/model": {"calls", "in", "out"}, summed over `answers` (extractions,
    decisions): what a job records of its model calls."""
    usage: Usage = {}
    for a in answers:
        counts = usage.setdefault(f"{a.provider}/{a.model}", {"calls": 0, "in": 0, "out": 0})
        counts["calls"] += 1
        counts["in"] += a.tokens_in
        counts["out"] += a.tokens_out
    return usage


def merge_usage(*usages: Usage) -> Usage:
    total: Usage = {}
    for usage in usages:
        for key, counts in usage.items():
            into = total.setdefault(key, {"calls": 0, "in": 0, "out": 0})
            for name, n in counts.items():
                into[name] += n
    return total
