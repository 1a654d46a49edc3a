"""orch agent: runs inside the container; imports the standard library, libtmux, pynvml and orchestrator.model only."""
