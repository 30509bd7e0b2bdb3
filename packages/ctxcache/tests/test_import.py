"""Importing the package is cheap: no torch, no onnxruntime, no onnx, no filesystem work."""

from __future__ import annotations

import json

from ctxcache_helpers import run_child

import qnnx_ctxcache as cc


def test_import_pulls_in_no_heavy_modules() -> None:
    """`import qnnx_ctxcache` loads neither torch, onnxruntime nor onnx."""
    done = run_child(
        "import sys, json, qnnx_ctxcache\n"
        "print(json.dumps([m for m in ('torch', 'onnxruntime', 'onnx', 'platformdirs') if m in sys.modules]))"
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []


def test_public_surface_is_sorted_and_complete() -> None:
    """__all__ is sorted (constants, classes, then functions, as ruff RUF022 orders it) and every name exists."""

    def order(name: str) -> tuple[int, str]:
        return (0 if name.isupper() else 1 if name[0].isupper() else 2, name)

    assert list(cc.__all__) == sorted(cc.__all__, key=order)
    assert len(set(cc.__all__)) == len(cc.__all__)
    for name in cc.__all__:
        assert hasattr(cc, name)
    assert isinstance(cc.__version__, str)


def test_errors_subclass_builtins() -> None:
    """Every public error derives from QnnxCtxcacheError and the matching builtin."""
    from qnnx_ctxcache import errors

    assert issubclass(errors.UnhashableKeyError, errors.QnnxCtxcacheError)
    assert issubclass(errors.UnhashableKeyError, ValueError)
    assert issubclass(errors.BuildOutputError, RuntimeError)
    assert issubclass(errors.InvalidOptionsError, ValueError)
    assert issubclass(errors.NotACacheRootError, ValueError)
