"""Runs one benchmark of THIS folder against whatever checkout `import bot` resolves to (used by the runner,
`python -m benchmarks --tree PATH`): binds the package name `benchmarks` to this folder, whatever `benchmarks`
package the tree under test has, then runs `benchmarks.NAME` as `__main__`.

    PYTHONPATH=TREE python /path/to/this/benchmarks/_bootstrap.py NAME [ARGS...]
"""

from __future__ import annotations

import importlib.util
import runpy
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> None:
    """Bind `benchmarks` to this folder and run the named benchmark with the remaining arguments."""
    # no bare imports of this folder's files (sys.path[0] is this folder when run by path)
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
    spec = importlib.util.spec_from_file_location("benchmarks", HERE / "__init__.py",
                                                  submodule_search_locations=[str(HERE)])
    assert spec is not None and spec.loader is not None
    package = importlib.util.module_from_spec(spec)
    sys.modules["benchmarks"] = package
    spec.loader.exec_module(package)
    name = sys.argv[1]
    sys.argv = [str(HERE / f"{name}.py"), *sys.argv[2:]]
    runpy.run_module(f"benchmarks.{name}", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
