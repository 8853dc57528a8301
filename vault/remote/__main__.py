"""`python -m vault.remote`: same as `vaultsim remote`."""

import sys

from vault.cli.remote import main

sys.exit(main())
