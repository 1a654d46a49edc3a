"""Renderers: watch (rich Live), check (exit codes, alerts), export (Prometheus), report (postmortem)."""
