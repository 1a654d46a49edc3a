"""orch: remote training orchestrator and GPU health monitor for Proxmox LXC containers."""

__version__ = "0.1.0"
