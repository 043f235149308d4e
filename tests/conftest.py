"""Suite-wide: the tests run the same inside a Kubernetes pod (a CI runner) as outside one.

``KUBERNETES_SERVICE_HOST`` makes the agent refuse a config without ``node:`` or ``NODE_NAME`` (the hostname would be
the pod's name); tests that mean to check that set it themselves. Removed here, before any test or agent subprocess
reads the environment.
"""

from __future__ import annotations

import os

os.environ.pop("KUBERNETES_SERVICE_HOST", None)
