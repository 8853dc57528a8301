"""`python -m vault.jail SPEC_JSON -- CMD ARGS`: run a command in a jail (vault.jail.enter.main);
`python -m vault.jail --keep REPORT -- CMD ARGS`: run it under a keeper, without a jail
(vault.jail.keeper.main)."""

import sys

if sys.argv[1:2] == ["--keep"]:
    from vault.jail.keeper import main as keep_main

    sys.exit(keep_main(sys.argv[1:]))
from vault.jail.enter import main

sys.exit(main())
