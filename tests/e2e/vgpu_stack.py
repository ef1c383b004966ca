"""Our scheduling stack on a ControlPlane, shared with the developer cluster; it lives in kube_vgpu_dev.stack.

Re-exported here so that tests keep importing ``from tests.e2e.vgpu_stack import Extender, ...``.
"""

from kube_vgpu_dev.stack import (
    BIND_GRACE_S,
    GPU_MEM,
    SCHEDULER,
    SPLIT,
    Extender,
    extender_and_scheduler,
    extender_rbac,
    gpu_nodes,
    inventory,
    lease_rbac,
    scheduler_config,
)

__all__ = [
    "BIND_GRACE_S",
    "GPU_MEM",
    "SCHEDULER",
    "SPLIT",
    "Extender",
    "extender_and_scheduler",
    "extender_rbac",
    "gpu_nodes",
    "inventory",
    "lease_rbac",
    "scheduler_config",
]
