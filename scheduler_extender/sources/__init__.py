"""Where the extender's state comes from: the Kubernetes API or a cluster file."""
