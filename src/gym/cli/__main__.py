"""`python -m gym.cli ...` is `gym ...`."""

import sys

from gym.cli import main

sys.exit(main())
