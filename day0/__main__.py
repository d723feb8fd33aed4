"""``python -m day0``: the ``day0`` command, for an environment whose scripts folder is not on PATH."""

import sys

from day0.cli import main

sys.exit(main())
