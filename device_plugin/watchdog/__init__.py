"""Enforcement watchdog: NVML per-process usage -> slices (via /proc/<pid>/cgroup) -> violation ladder."""
