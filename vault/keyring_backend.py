"""The embedded keyring's old import path, kept for `PYTHON_KEYRING_BACKEND` settings users already have.

`PYTHON_KEYRING_BACKEND=vault.keyring_backend.FileKeyring` was the documented way to select
vaultsim's file keyring before the store moved to `vault.store`; a CI config that still says so
keeps working. New settings name `vault.store.keyring_backend.FileKeyring`.
"""

from vault.store.keyring_backend import FileKeyring

__all__ = ["FileKeyring"]
