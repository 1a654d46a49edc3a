"""The sandbox's ``pct`` stand-in: pct's grammar, messages and exit codes (``cli``) over two
backends, real LXC containers (``lxcmode``: lxc-attach, lxc-info, lxc-start...) or process-mode
directories (``procmode``). Standard library only: it runs as ``python -E -S bin/pct``."""
