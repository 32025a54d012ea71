"""How redaction time grows with the line length, on the pathological lines that once took seconds
(`a.a.a...`, runs of dashes, repeated `--token `, ...): prints, per line shape, the median time of one
`redact()` of a 16 KiB, 32 KiB and 64 KiB line and the ratios 32K/16K and 64K/16K. Linear work gives
ratios near 2 and 4; quadratic work about 4 and 16.

    .venv/bin/python -m benchmarks.redact_scaling
"""

from __future__ import annotations

import statistics
import time

from bot.core.redact import redact

SHAPES = {
    "a.": "a.", "x-": "x-", "dashes": "-", "login": "login u ", "sk-": "sk-", "--token": "--token ",
    "query": "?token=a&", "quotes": 'a, ,"', "pem-begin": "A ", "url": "https://u:",
    # issue 23's families
    "login(": "login(", "echo": "echo ", "token-flags": "token --a b ", "set -a": "set -a token ", "%41a": "%41a",
    "-u a": "-u a ", "eyJ": "eyJ ", "prefix_": "ab_" + "Xy9" * 8 + " ",
}
PREFIX = {"quotes": 'token="', "pem-begin": "-----BEGIN ", "echo": "sudo -S ", "token-flags": "value ",
          "%41a": "%22token%22%3A ", "-u a": "-p "}


def median_s(line: str, runs: int = 5) -> float:
    """Median seconds of `redact(line)` over `runs` runs."""
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        redact(line)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    print(f"{'shape':<10} {'16 KiB ms':>10} {'32 KiB ms':>10} {'64 KiB ms':>10} {'32K/16K':>8} {'64K/16K':>8}")
    for name, unit in SHAPES.items():
        sizes = [16 * 1024, 32 * 1024, 64 * 1024]
        lines = [PREFIX.get(name, "") + unit * (n // len(unit)) for n in sizes]
        t = [median_s(line) for line in lines]
        print(f"{name:<10} {t[0] * 1e3:>10.2f} {t[1] * 1e3:>10.2f} {t[2] * 1e3:>10.2f} "
              f"{t[1] / t[0]:>8.2f} {t[2] / t[0]:>8.2f}")


if __name__ == "__main__":
    main()
