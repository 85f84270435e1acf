"""``python -m magnetar.cli``: the ``magnetar`` command."""

import sys

from magnetar.cli import main

sys.exit(main())
