"""`python -m vault.jail SPEC_JSON -- CMD ARGS`: run a command in a jail (vault.jail.enter.main)."""

import sys

from vault.jail.enter import main

sys.exit(main())
