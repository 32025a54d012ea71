"""Secret param values sealed for the database, so a restarted bot still masks them by value.

A launch's secret params (`api_key`, a param marked `secret: true`) are stored masked in `launches.params`;
their values are needed again after a restart, to mask them wherever they still turn up (the live server's
command line and log) and to relaunch with them. They are kept in `launches.sealed_secrets`, encrypted with
Fernet (the `cryptography` library: AES-128-CBC and HMAC-SHA256, with a timestamp) under a key that is NOT in
the database: `GPUBOT_SECRET_KEY` from the environment when set (a Fernet key: 32 url-safe base64 bytes, made
by `python -c "from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())"`), else the file
`secret.key` beside the SQLite database (mode 0600, created on first use). A database copied without its key
holds no readable secret.
"""

from __future__ import annotations

import json
import logging
import os
import stat
from collections.abc import Mapping
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken

__all__ = ["KEY_ENV", "KEY_FILE", "SecretBox", "SecretBoxError"]

#: Environment variable holding the Fernet key (wins over the key file).
KEY_ENV = "GPUBOT_SECRET_KEY"
#: Name of the key file in the key directory.
KEY_FILE = "secret.key"


class SecretBoxError(Exception):
    """A key that is not a Fernet key, a key file that cannot be read or made, or a sealed value that this key
    did not seal (the key changed) or that is damaged. The message says which."""

log = logging.getLogger(__name__)


def _read_key(path: Path) -> bytes | None:
    """The key in the regular file `path`, or None when there is no such file. Never follows a symlink and
    never blocks (a FIFO there is refused). Raises SecretBoxError for a file that is not a regular file, cannot
    be read, or is empty."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as e:  # a symlink (ELOOP), no permission, ...
        raise SecretBoxError(f"cannot read {path}: {e.strerror or e} (it must be a regular file)") from None
    try:
        st = os.fstat(fd)
        mode = st.st_mode
        if not stat.S_ISREG(mode):
            raise SecretBoxError(f"{path} is not a regular file")
        if st.st_uid != os.geteuid():  # planted by another user (in a directory others can write to)
            log.warning("%s belongs to user id %d, not to this bot's (%d): whoever owns it can read every sealed "
                        "secret param; remove it (a new key is made) or `chown` it", path, st.st_uid, os.geteuid())
        if mode & 0o077:  # group or others may read it: anyone who can read it can open every sealed value
            log.warning("%s is readable by others (mode %o): anyone who can read it can open the sealed secret "
                        "params; fix it with `chmod 600 %s`", path, stat.S_IMODE(mode), path)
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(4096).strip()
    except OSError as e:
        raise SecretBoxError(f"cannot read {path}: {e.strerror or e}") from None
    finally:
        os.close(fd)
    if not data:
        raise SecretBoxError(f"{path} is empty")
    return data


class SecretBox:
    """Seals and unseals a launch's secret values ({param name: value}) with one Fernet key."""

    def __init__(self, key: bytes):
        try:
            self._fernet = Fernet(key)
        except (ValueError, TypeError) as e:
            raise SecretBoxError(f"not a Fernet key (32 url-safe base64-encoded bytes): {e}") from None

    @classmethod
    def for_directory(cls, directory: str | os.PathLike[str], environ: Mapping[str, str] | None = None) -> SecretBox:
        """The box of a bot whose database lives in `directory`: the key from KEY_ENV when set, else from
        `directory/secret.key`, which is created (mode 0600, exclusively) when missing, its directory too (0700).
        A key file others may read, or that another user owns, is used with a warning. Raises SecretBoxError
        for a bad key or a key file that cannot be read or written."""
        env = os.environ if environ is None else environ
        if env.get(KEY_ENV):
            return cls(env[KEY_ENV].strip().encode())
        home = Path(os.path.expanduser(str(directory)))
        try:  # the state directory of a bot on a server database is made by nothing else
            home.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as e:
            raise SecretBoxError(f"cannot create {home}: {e.strerror or e}") from None
        path = home / KEY_FILE
        key = _read_key(path)
        if key is not None:
            return cls(key)
        key = Fernet.generate_key()
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except FileExistsError:  # another process made it first (or a dangling link is in the way)
            key = _read_key(path)
            if key is None:
                raise SecretBoxError(f"{path} exists but cannot be read as a key file") from None
            return cls(key)
        except OSError as e:
            raise SecretBoxError(f"cannot create {path}: {e.strerror or e}") from None
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(key + b"\n")
        except OSError as e:
            raise SecretBoxError(f"cannot write {path}: {e.strerror or e}") from None
        return cls(key)

    def seal(self, values: Mapping[str, str]) -> str:
        """`values` ({param name: value}, strings) encrypted: an ASCII Fernet token."""
        return self._fernet.encrypt(json.dumps(dict(values), sort_keys=True).encode("utf-8")).decode("ascii")

    def unseal(self, token: str) -> dict[str, str]:
        """The {param name: value} that `seal` turned into `token`. Raises SecretBoxError when this key did not
        seal it or it is damaged."""
        try:
            data = json.loads(self._fernet.decrypt(token.encode("ascii")))
        except (InvalidToken, ValueError, UnicodeError) as e:
            raise SecretBoxError("a sealed value this key cannot open (the key changed, or the value is "
                                 f"damaged): {type(e).__name__}") from None
        if not isinstance(data, dict):
            raise SecretBoxError("a sealed value that is not a mapping")
        return {str(k): str(v) for k, v in data.items()}
