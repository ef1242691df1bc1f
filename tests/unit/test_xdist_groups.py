"""Under ``-n 2 --dist loadgroup`` the tests sharing an expensive session fixture
run on one pytest-xdist worker, so it is built once (tests/conftest.py). pytest
9.2 silently broke this (xdist 3.8 renames node ids the way 9.1 read them), so
the grouping is checked here with the project's own hook, on two real workers."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # two pytest-xdist workers in a child pytest: ~15 s
def test_tests_sharing_the_stack_fixture_run_on_one_xdist_worker(tmp_path: Path):
    (tmp_path / "conftest.py").write_text(
        "import pytest\n"
        "from tests.conftest import pytest_collection_modifyitems  # noqa: F401  the hook under test\n"
        "@pytest.fixture(scope='session')\n"
        "def stack():\n"
        "    return object()\n",
        encoding="utf-8",
    )
    tests = "".join(
        f"def test_s{i}(stack):\n    time.sleep(0.2)\n\ndef test_p{i}():\n    time.sleep(0.2)\n\n" for i in range(4)
    )
    (tmp_path / "test_groups.py").write_text("import time\n\n" + tests, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-v", "-p", "no:cacheprovider",
         "--rootdir", str(tmp_path), str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    ran = re.findall(r"\[(gw\d)\].*PASSED \S*::(test_\w+)", done.stdout)
    assert len(ran) == 8, done.stdout
    stack_workers = {gw for gw, name in ran if name.startswith("test_s")}
    assert len(stack_workers) == 1, f"the stack tests ran on {sorted(stack_workers)}:\n{done.stdout}"
