"""The trainer version (its own module: an editable install made before trainer/__init__.py existed
resolves ``trainer`` as a namespace package, and this import still works there)."""

__version__ = "0.1.0"
