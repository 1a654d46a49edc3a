"""Changing a container's state: ``launch`` (start, verify), ``preflight``, ``bundle`` (the
bundled trainer), ``stop``, ``runs`` (runs, logs, status, attach), ``procedures``."""
