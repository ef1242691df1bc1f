"""``python -m workers.cli``: the ``dimple`` command (a worker's supervised child and tests start it so)."""

import sys

from .commands import main

sys.exit(main())
