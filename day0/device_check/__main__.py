"""``python -m day0.device_check``: what scripts/device-check.sh starts on the device machine."""

import sys

from day0.device_check.run import main

sys.exit(main())
