"""The `vgpu` command line: see who holds which slice of which GPU, and replay workloads without a cluster."""
