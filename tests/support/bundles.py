"""Reading a bundle the bot posted (a `.tar.gz` of one top folder) in tests."""

from __future__ import annotations

import io
import tarfile


def bundle_files(data: bytes) -> dict[str, bytes]:
    """The files of a posted bundle: path under its top folder (`server.log`, `node-n2/ps.txt`) -> content. Raises
    tarfile.TarError when `data` is no tar archive."""
    out: dict[str, bytes] = {}
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for member in tar.getmembers():
            f = tar.extractfile(member) if member.isfile() else None
            if f is not None and "/" in member.name:
                out[member.name.split("/", 1)[1]] = f.read()
    return out
