"""The simulated Proxmox host: a real sshd, a pct stand-in, a fake libnvidia-ml and scenarios."""
