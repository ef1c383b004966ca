"""CUDA MPS operated by the plugin: the control daemon's commands (control) and its lifecycle (daemon)."""
