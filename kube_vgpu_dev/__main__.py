"""``python -m kube_vgpu_dev``: the developer cluster (see kube_vgpu_dev.cli)."""

import sys

from kube_vgpu_dev.cli import main

sys.exit(main())
