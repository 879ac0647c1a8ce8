"""Test support shipped with the package: the stateful conformance machine and its helpers."""
