"""Secret params of launches: which params are secrets, teaching the shared redactor their values (typed, given
to a launch, or sealed in the rows of earlier launches), params as recorded (masked), and sealing them for a
relaunch or a restart."""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from bot.adapters.secretbox import SecretBox, SecretBoxError
from bot.adapters.store.launches import LaunchRepository
from bot.config import Config
from bot.core.commands import slash
from bot.core.lifecycle import LaunchError
from bot.core.models import Launch
from bot.core.redact import MASK, SECRET_NAME_RE, Redactor

log = logging.getLogger(__name__)
#: How many launch ids below the newest learned `learn_new` reads again (see there).
LEARN_OVERLAP = 50


class SecretService:
    """The secret params of the config's variants and what the bot knows of their values. With a `box`, a
    launch's secret values are kept sealed in its row (`seal`, `sealed`) and learnt again after a restart
    (`relearn`)."""

    def __init__(self, config: Config, launches: LaunchRepository, redactor: Redactor, box: SecretBox | None = None):
        self.config = config
        self._launches = launches
        self._redactor = redactor
        self._box = box
        self._names: set[str] | None = None
        self._learned_up_to: int | None = None  # the newest launch id whose sealed secrets were learned

    def params(self, variant: str, params: dict[str, Any]) -> dict[str, str]:
        """The params among `params` that are secrets (secret-named, or `secret: true` in the variant), as
        {name: value} strings (empty values left out)."""
        specs: dict[str, Any] = {}
        if variant in self.config.variants:
            with contextlib.suppress(KeyError):
                specs = dict(self.config.resolved_variant(variant).params or {})
        return {str(k): str(v) for k, v in params.items() if str(v) and v != MASK
                and (SECRET_NAME_RE.search(str(k)) or getattr(specs.get(k), "secret", False))}

    def names(self) -> set[str]:
        """Names of the params that are secrets in any variant (`secret: true`, or secret-named); worked out once
        (the config does not change while the bot runs)."""
        if self._names is not None:
            return self._names
        names: set[str] = set()
        for name in self.config.variants:
            with contextlib.suppress(KeyError, ValueError):
                for k, spec in (self.config.resolved_variant(name).params or {}).items():
                    if getattr(spec, "secret", False) or SECRET_NAME_RE.search(k):
                        names.add(k)
        self._names = names
        return names

    def learn_typed(self, text: str, kwargs: dict[str, str] | None = None) -> None:
        """Teach the redactor the values of a typed command's secret params, whatever the command turns out to
        be: the parsed `kwargs` (names as the grammar normalises them) and the raw `NAME=VALUE` words of `text`
        (quotes dropped), where NAME, lower-cased with `-` as `_`, is a secret param of any variant or
        secret-named."""
        names = {n.lower().replace("-", "_") for n in self.names()}

        def secret(name: str) -> bool:
            norm = name.lstrip("-").lower().replace("-", "_")  # `--key=V` names the param `key` too
            return norm in names or bool(SECRET_NAME_RE.search(norm))

        values = [str(v) for k, v in (kwargs or {}).items() if secret(str(k))]
        for word in (text or "").split():
            name, sep, value = word.partition("=")
            if sep and value and secret(name):
                values.append(value.strip("'\""))
        self._redactor.add_values(values)

    def learn(self, variant: str, params: dict[str, Any]) -> None:
        """Teach the shared redactor the values of `params` that are secrets (`params`), so they are masked by
        value wherever they turn up (a command line under an ordinary flag such as `--key`, a log line, an
        error)."""
        self._redactor.add_values(self.params(variant, params).values())

    def relearn(self) -> int:
        """Teach the redactor the sealed secret values of the newest launches (a restart: the live servers
        still show them). Returns how many launches' values were learned; values this key cannot open (the key
        changed) are skipped with one warning. Never raises for a database or key problem (logged)."""
        return self._learn_sealed(after_id=None, quiet=False)

    def learn_new(self) -> int:
        """Teach the redactor the sealed secret values of the launches made since the last `relearn` or `learn_new`
        (by another bot of a shared database). Returns how many; never raises (logged)."""
        # ids are taken at insert and committed later: a launch of a lower id may commit after a higher one, so
        # the newest LEARN_OVERLAP ids are read again (learning a value twice is harmless)
        after = None if self._learned_up_to is None else max(0, self._learned_up_to - LEARN_OVERLAP)
        return self._learn_sealed(after_id=after, quiet=True)

    def _learn_sealed(self, *, after_id: int | None, quiet: bool) -> int:
        if self._box is None:
            return 0
        try:
            rows = self._launches.sealed_secrets(after_id=after_id)
        except Exception as e:  # at start a warning; the every-second look for new launches is only debug
            log.log(logging.DEBUG if quiet else logging.WARNING,
                    "cannot read the sealed secrets of earlier launches: %s", e)
            return 0
        learned, failed = 0, 0
        if rows:
            self._learned_up_to = max(self._learned_up_to or 0, max(i for i, _ in rows))
        for _launch_id, token in rows:
            try:
                self._redactor.add_values(self._box.unseal(token).values())
                learned += 1
            except SecretBoxError:
                failed += 1
        if failed:
            log.warning("the secret values of %d earlier launches cannot be opened with this key (GPUBOT_SECRET_KEY "
                        "or secret.key changed): they are masked by name and shape only", failed)
        return learned

    def seal(self, secret: dict[str, str]) -> str | None:
        """`secret` sealed for a launch's row, or None without a box or without a secret."""
        return self._box.seal(secret) if self._box is not None and secret else None

    def relaunch_params(self, la: Launch, params: dict[str, str]) -> dict[str, str]:
        """The params a relaunch of `la` runs with: its own, updated by `params`; a secret stored masked gets its
        sealed value back. Raises LaunchError for a value stored masked that cannot be restored (never relaunched
        with "[REDACTED]" or a default: it must be given again)."""
        merged = {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in la.params.items()
                  if v != MASK}  # a secret param is stored masked: its sealed value, else its default, or given
        sealed = self.sealed(la)
        merged.update({k: v for k, v in sealed.items() if la.params.get(k) == MASK})
        merged.update(params)
        lost = sorted(k for k, v in la.params.items() if MASK in str(v) and k not in params
                      and not (v == MASK and k in sealed))
        if lost:  # a value stored masked that cannot be restored: never relaunch with "[REDACTED]" or a default
            given = " ".join(f"{k}=" for k in lost)  # no placeholder value: redaction would mask it
            raise LaunchError(f"{la.name}'s {', '.join(lost)} {'was' if len(lost) == 1 else 'were'} stored masked and "
                              f"cannot be reused here (its sealed copy is missing or its key changed): give "
                              f"{'it' if len(lost) == 1 else 'them'} again: `{slash('relaunch', la.id, given)}` with "
                              f"the value after {'the' if len(lost) == 1 else 'each'} `=`")
        return merged

    def sealed(self, la: Launch) -> dict[str, str]:
        """The secret param values sealed in `la`'s row ({} without a box, or when they cannot be opened)."""
        if self._box is None:
            return {}
        try:
            rows = self._launches.sealed_secrets(la.id)
            return self._box.unseal(rows[0][1]) if rows else {}
        except Exception as e:
            log.warning("cannot open the secret params of %s: %s", la.name, e)
            return {}

    def for_record(self, params: dict) -> dict:
        """Params as recorded anywhere (audit trail, launches table): secret-named params masked, the rest
        redacted."""
        return self._redactor.mapping({k: v if isinstance(v, (int, float, bool)) else str(v)
                                       for k, v in params.items()})
