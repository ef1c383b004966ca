"""Test doubles shipped with the package for tests and local runs; production code never imports this."""
