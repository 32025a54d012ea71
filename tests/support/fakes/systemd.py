"""Stand-ins for `systemd-run`, `systemctl` and `loginctl` on PATH, for hosts without a running systemd (this
machine and CI run in containers whose PID 1 is not systemd). They record every call and behave like the real
tools as far as a launch sees them: `systemd-run --scope ... -- CMD` execs CMD (the real one also execs it,
after moving itself into the new scope); `show-environment` succeeds while the manager is "up"; `kill` is
only recorded (no cgroup here to signal), so what a kill stops is still found by tag and PID."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

_SYSTEMD_RUN = r"""#!/bin/sh
d=$(dirname "$0")
echo "systemd-run $*" >> "$d/calls"
while [ $# -gt 0 ]; do
  case "$1" in
    --) shift; break ;;
    --*) shift ;;
    *) break ;;
  esac
done
[ -e "$d/scope-refused" ] && { echo "Failed to start transient scope unit: Access denied" >&2; exit 1; }
exec "$@"
"""

_SYSTEMCTL = r"""#!/bin/sh
d=$(dirname "$0")
echo "systemctl $*" >> "$d/calls"
case " $* " in
  *" show-environment "*) [ -e "$d/manager-down" ] && exit 1; echo "PATH=/usr/bin"; exit 0 ;;
esac
exit 0
"""

_LOGINCTL = r"""#!/bin/sh
d=$(dirname "$0")
echo "loginctl $*" >> "$d/calls"
echo yes
"""


@dataclass
class SystemdStandIns:
    """The stand-ins installed in `bin_dir`; `path` is a PATH value with them first."""

    bin_dir: Path

    @property
    def path(self) -> str:
        """`bin_dir` first, then the usual system directories."""
        return f"{self.bin_dir}:/usr/local/bin:/usr/bin:/bin"

    def calls(self) -> list[str]:
        """Every recorded call, oldest first (`systemctl --no-ask-password kill ...`)."""
        f = self.bin_dir / "calls"
        return f.read_text().splitlines() if f.exists() else []

    def refuse_scopes(self) -> None:
        """Make `systemd-run --scope` fail (as for a user without a D-Bus session or a polkit refusal)."""
        (self.bin_dir / "scope-refused").touch()

    def stop_manager(self) -> None:
        """Make `show-environment` fail (as when no manager answers)."""
        (self.bin_dir / "manager-down").touch()


def install_systemd_standins(bin_dir: Path) -> SystemdStandIns:
    """Write the three stand-ins (mode 0755) into `bin_dir` (created) and return them."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name, body in (("systemd-run", _SYSTEMD_RUN), ("systemctl", _SYSTEMCTL), ("loginctl", _LOGINCTL)):
        p = bin_dir / name
        p.write_text(body)
        p.chmod(0o755)
    assert shlex.quote(str(bin_dir)) == str(bin_dir), "the stand-in directory must need no quoting"
    return SystemdStandIns(bin_dir)
