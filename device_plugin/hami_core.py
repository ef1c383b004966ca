"""HAMi-core on the host, when the admin provides its library: the preload file and lock folder the plugin
writes at start for Allocate to mount (device_plugin.envs). HAMi ships the same one-line ld.so.preload naming
the library's path in the container; the dynamic loader reads /etc/ld.so.preload before any program's own
libraries, so every process in the container loads HAMi-core without LD_PRELOAD in its env.
"""

from __future__ import annotations

import os

from device_plugin.envs import HAMI_CORE_LIBRARY_IN_CONTAINER, EnvSettings


def install(settings: EnvSettings) -> None:
    """Write the preload file (atomically) and create the shared lock folder; OSError if the host path is not
    writable (the DaemonSet mounts its folder)."""
    if not settings.hami_core_library:
        return
    os.makedirs(os.path.dirname(settings.hami_core_preload_file), mode=0o755, exist_ok=True)
    tmp = settings.hami_core_preload_file + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(HAMI_CORE_LIBRARY_IN_CONTAINER + "\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, settings.hami_core_preload_file)
    os.makedirs(settings.hami_core_lock_dir, exist_ok=True)
    os.chmod(settings.hami_core_lock_dir, 0o1777)  # containers run as any uid; sticky like /tmp
