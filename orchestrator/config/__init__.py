"""hosts.yaml -> typed inventory: ``inventory`` (the dataclasses, loading), ``reader`` (YAML
with line numbers), ``schema`` (every field, the generated docs/hosts-yaml.md)."""
