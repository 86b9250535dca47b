"""Walks, positions, imports, source facts: no framework knowledge."""
