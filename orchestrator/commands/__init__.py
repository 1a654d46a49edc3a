"""orch's commands, one module per section of ``orch --help``; typer glue only.

``_app.py`` holds the shared ``app`` and helpers; ``orchestrator/cli.py`` imports the
section modules in help order (each registers its commands on ``app`` when imported).
This package imports nothing itself, so ``_app`` loads without the commands.
"""
