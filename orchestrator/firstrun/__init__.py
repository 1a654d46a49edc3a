"""The first five minutes: ``init`` (a starter hosts.yaml), ``doctor`` (the checklist),
``demo`` (the whole loop on this machine)."""
