"""`python -m vault.remote`: same as `vaultsim remote`."""

import sys

from .cli import main

sys.exit(main())
