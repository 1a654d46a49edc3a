"""Self-healing runs: the restart decision (:mod:`.decide`, pure) and the process that
acts on it (:mod:`.healer`: ``orch supervise`` and ``orch check --heal``). Above the monitor,
the lifecycle and the postmortem, whose observations, procedures and verdicts it uses."""
