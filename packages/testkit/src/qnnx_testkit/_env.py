"""Environments for child processes of a test."""

from __future__ import annotations

import os


def pythonpath_env(*folders: str | os.PathLike[str]) -> dict[str, str]:
    """``{"PYTHONPATH": ...}`` with ``folders`` first, then this process's ``$PYTHONPATH``: a child interpreter
    imports a test's helper modules from there (pytest's ``pythonpath`` option reaches only this process)."""
    parts = [os.fspath(folder) for folder in folders]
    inherited = os.environ.get("PYTHONPATH")
    if inherited:
        parts.append(inherited)
    return {"PYTHONPATH": os.pathsep.join(parts)}
