"""orch agent: runs inside the container; imports the standard library, pynvml and orchestrator.wire.model only."""
