"""Playbooks: load and validate ``playbooks/*.yaml`` (loader, steps) and match logs against
them (matching)."""
