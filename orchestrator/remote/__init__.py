"""Remote handles: the agent bundle (deploy), one container (target), one host's observer
(hostlink)."""
