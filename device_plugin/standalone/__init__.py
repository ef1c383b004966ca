"""The node daemon outside Kubernetes: endpoints from a local file, the same router feed on the host address."""
