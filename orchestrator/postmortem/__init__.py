"""``orch postmortem``: ``collect`` (evidence, I/O; the bundle) and ``verdict`` (pure judgement)."""
