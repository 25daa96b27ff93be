"""``python -m fednorm`` is the ``fednorm`` command."""

import sys

from .cli.main import main

sys.exit(main())
