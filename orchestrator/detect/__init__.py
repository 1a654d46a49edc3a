"""Pure detectors: a target's snapshot history (and host probes) in, findings out."""
