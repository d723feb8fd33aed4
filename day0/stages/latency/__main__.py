"""``python -m day0.stages.latency``: the stage's own command line (also ``day0 latency``)."""

import sys

from day0.stages.latency import main

sys.exit(main())
