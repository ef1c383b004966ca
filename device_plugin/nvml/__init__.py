"""NVML access: a Protocol mirroring the pynvml functions we use, the real backend, and discovery on top."""
