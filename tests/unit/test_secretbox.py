"""bot.adapters.secretbox: sealed secret values open only with their key; the key file is private."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from cryptography.fernet import Fernet

from bot.adapters.secretbox import KEY_ENV, KEY_FILE, SecretBox, SecretBoxError


def test_a_sealed_value_opens_with_the_same_key_file_and_hides_the_value(tmp_path):
    box = SecretBox.for_directory(tmp_path, environ={})
    token = box.seal({"api_key": "Zq8vT3kLm9Rp", "ctl": "x y"})
    assert "Zq8vT3kLm9Rp" not in token
    assert stat.S_IMODE((tmp_path / KEY_FILE).stat().st_mode) == 0o600
    assert SecretBox.for_directory(tmp_path, environ={}).unseal(token) == {"api_key": "Zq8vT3kLm9Rp", "ctl": "x y"}


def test_the_environment_key_wins_and_another_key_cannot_open_it(tmp_path):
    key = Fernet.generate_key().decode()
    token = SecretBox.for_directory(tmp_path, environ={KEY_ENV: key}).seal({"k": "v"})
    assert not (tmp_path / KEY_FILE).exists()  # the environment's key: no file made
    with pytest.raises(SecretBoxError, match="key changed"):
        SecretBox.for_directory(tmp_path, environ={}).unseal(token)
    with pytest.raises(SecretBoxError, match="damaged"):
        SecretBox(key.encode()).unseal(token[:-4] + "AAAA")


def test_a_bad_key_is_a_clear_error(tmp_path):
    with pytest.raises(SecretBoxError, match="not a Fernet key"):
        SecretBox.for_directory(tmp_path, environ={KEY_ENV: "short"})
    (tmp_path / "sub").write_text("a file")
    with pytest.raises(SecretBoxError, match="cannot"):
        SecretBox.for_directory(tmp_path / "sub", environ={})


@pytest.mark.parametrize("shape", ["a dangling symlink", "a fifo", "an empty file", "a directory"])
def test_a_key_file_that_is_not_a_key_is_a_clear_error_never_a_hang(tmp_path, shape):
    import os

    path = tmp_path / KEY_FILE
    if shape == "a dangling symlink":
        path.symlink_to(tmp_path / "nowhere")
    elif shape == "a fifo":
        os.mkfifo(path)
    elif shape == "an empty file":
        path.write_bytes(b"")
    else:
        path.mkdir()
    with pytest.raises(SecretBoxError):
        SecretBox.for_directory(tmp_path, environ={})


def test_a_key_file_others_can_read_gets_a_warning_with_its_fix(tmp_path, caplog):
    import logging

    from bot.adapters.secretbox import KEY_FILE, SecretBox

    box = SecretBox.for_directory(tmp_path, environ={})
    key = tmp_path / KEY_FILE
    assert key.stat().st_mode & 0o777 == 0o600
    with caplog.at_level(logging.WARNING, logger="bot.adapters.secretbox"):
        SecretBox.for_directory(tmp_path, environ={})
    assert not caplog.records  # 0600: nothing to say
    key.chmod(0o644)
    with caplog.at_level(logging.WARNING, logger="bot.adapters.secretbox"):
        again = SecretBox.for_directory(tmp_path, environ={})
    assert f"chmod 600 {key}" in caplog.text and "mode 644" in caplog.text
    assert again.unseal(box.seal({"k": "v"})) == {"k": "v"}  # the same key, still used


def test_a_bot_on_postgresql_keeps_its_key_in_the_state_directory(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from bot.adapters.secretbox import KEY_ENV, KEY_FILE
    from bot.config import Config
    from bot.wiring import _secret_box

    monkeypatch.delenv(KEY_ENV, raising=False)
    config = Config.model_validate({"hosts": {"h": {"local": True}}, "state_dir": str(tmp_path / "state")})
    (tmp_path / "state").mkdir()
    store = SimpleNamespace(url="postgresql+psycopg://gpubot@db.internal/gpubot",
                            db=SimpleNamespace(path="postgresql+psycopg://gpubot:***@db.internal/gpubot"))
    box = _secret_box(store, config)  # type: ignore[arg-type]
    assert box is not None and (tmp_path / "state" / KEY_FILE).stat().st_mode & 0o777 == 0o600
    again = _secret_box(store, config)  # type: ignore[arg-type]
    assert again is not None and again.unseal(box.seal({"api_key": "v"})) == {"api_key": "v"}


def test_a_missing_state_directory_is_made_private_with_the_key_in_it(tmp_path: Path) -> None:
    """A bot on a server database (PostgreSQL) has no SQLite file to make its state directory."""
    state = tmp_path / "fresh" / "state"
    box = SecretBox.for_directory(state, environ={})
    assert box.unseal(box.seal({"k": "v"})) == {"k": "v"}
    assert (state / KEY_FILE).stat().st_mode & 0o777 == 0o600
    assert state.stat().st_mode & 0o777 == 0o700


def test_a_key_file_owned_by_another_user_is_named_in_a_warning(tmp_path: Path, caplog) -> None:
    if os.geteuid() != 0:
        pytest.skip("changing a file's owner needs root")
    SecretBox.for_directory(tmp_path, environ={})
    os.chown(tmp_path / KEY_FILE, 65534, 65534)
    with caplog.at_level("WARNING"):
        SecretBox.for_directory(tmp_path, environ={})
    assert "belongs to user id 65534" in caplog.text
