"""Reporting stage: result rows -> JSON, CSV, Markdown tables and plots."""

from budgeted_attention.reporting.results import aggregate, write_results

__all__ = ["aggregate", "write_results"]
