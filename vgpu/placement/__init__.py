"""Placement policies (one module each), their registry, and the role-aware score terms."""
