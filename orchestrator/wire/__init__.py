"""The wire kernel: stdlib-only modules shared by the operator and the agent; the whole
folder ships in the agent bundle (:func:`orchestrator.remote.deploy.build_bundle`)."""
