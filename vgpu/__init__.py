"""kube-vgpu domain core: requests, devices, roles, annotation codecs, cluster state, placement.

Pure Python with no I/O: the scheduler extender, the device plugin, the webhook, the CLI and the
benchmarks all call into this package, so a placement rule lives in exactly one place.
"""

__version__ = "0.1.0"
