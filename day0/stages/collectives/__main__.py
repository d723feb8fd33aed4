"""``python -m day0.stages.collectives``: the stage's own command line (also ``day0 collectives``)."""

import sys

from day0.stages.collectives import main

sys.exit(main())
