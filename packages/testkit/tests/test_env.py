"""pythonpath_env: a child interpreter imports from the folders given, before the inherited $PYTHONPATH."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from qnnx_testkit import pythonpath_env


def test_folders_come_before_the_inherited_pythonpath(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PYTHONPATH", "inherited")
    assert pythonpath_env(tmp_path, "b") == {"PYTHONPATH": os.pathsep.join([str(tmp_path), "b", "inherited"])}
    monkeypatch.delenv("PYTHONPATH")
    assert pythonpath_env(tmp_path) == {"PYTHONPATH": str(tmp_path)}


def test_a_child_imports_a_helper_from_the_folder(tmp_path: Path) -> None:
    (tmp_path / "testkit_child_helper.py").write_text("VALUE = 42\n")
    env = {**os.environ, **pythonpath_env(tmp_path)}
    code = "import testkit_child_helper; print(testkit_child_helper.VALUE)"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False, cwd="/")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "42"
