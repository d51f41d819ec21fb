"""``python -m blacc ...`` is the ``blacc`` command."""

import sys

from .cli import main

sys.exit(main())
