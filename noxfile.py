"""The one entry point for qnnx tasks: `python -m nox -l` lists the sessions; CI runs `tests`.

Venvs are made with the standard library's venv and filled with pip: on these machines pip takes the local CPU
build of torch 2.13.0 without downloading, while uv and poetry would download several GB of CUDA wheels.
"""

from __future__ import annotations

import os
from pathlib import Path

import nox

nox.needs_version = ">=2024.3.2"
nox.options.default_venv_backend = "venv"
nox.options.sessions = ["tests"]
nox.options.error_on_external_run = True

ROOT = Path(__file__).parent
PYTHON = "3.11"
LEAVES = ("detection", "export", "opcheck", "ctxcache")
# clikit: the foundation every package may import (CLI conventions, the chip table); testkit: test support only.
PACKAGES = ("clikit", *LEAVES, "backend", "testkit")
# The default pins: what CI, the demo and the benchmarks run. A range such as torch>=2.13,<2.15 would make pip
# pick 2.14.1, a 5.5 GB CUDA build; the matrix session tests 2.14 on purpose.
TORCH = "torch==2.13.0"
ORT_QNN = "onnxruntime-qnn==2.7.0"
# expecttest: torch.testing._internal (the OpInfo database of the conformance tests) imports it; pytest-xdist runs
# the long suites on every core.
TEST_EXTRAS = ("transformers>=4.45", "expecttest", "pytest-xdist>=3.6")
# The suites that take a minute or more run on every core (pytest-xdist, at most 4 workers for memory), module by
# module so that a module's fixtures are built once. On the 2-core bench: integration 23 -> 15 minutes, export
# 8.9 -> 6.8 (two workers share the cores' caches). The short suites run in one process: starting workers would
# cost more than it saves. `nox -s tests -- -n 0` runs every suite in one process.
PARALLEL = frozenset({"export", "opcheck", "backend", "integration-tests"})
MATRIX_TORCH = ("2.13.0", "2.14.1")
MATRIX_ORT_QNN = ("2.4.0", "2.5.0", "2.6.0", "2.7.0")


def _install(session: nox.Session, torch: str = TORCH, ort_qnn: str = ORT_QNN, test: bool = True) -> None:
    session.install("--upgrade", "pip")
    session.install(torch, ort_qnn)
    extra = "[test]" if test else ""
    # One pip command: the siblings each package requires (qnnx-clikit, and qnnx-testkit for the test extras) are
    # then taken from the tree, not from PyPI.
    names = PACKAGES if test else tuple(n for n in PACKAGES if n != "testkit")
    args = [arg for name in names for arg in ("-e", f"{ROOT / 'packages' / name}{extra}")]
    session.install(*args, *(TEST_EXTRAS if test else ()))


def _versions(session: nox.Session) -> None:
    session.run(
        "python",
        "-c",
        "import importlib.metadata as m; print(' | '.join(f'{d} {m.version(d)}' for d in "
        "('torch', 'onnxruntime', 'onnxruntime-qnn', 'onnx', 'onnxscript')))",
    )


def _pytest(session: nox.Session, *extra: str) -> None:
    env = {"HYPOTHESIS_PROFILE": os.environ.get("HYPOTHESIS_PROFILE", "ci")}
    marker = () if "-m" in session.posargs else ("-m", "not slow")
    suites = [(name, f"packages/{name}/tests") for name in PACKAGES] + [("integration-tests", "integration-tests")]
    for name, path in suites:  # one run per package, so each is tested in its own processes
        workers = ("-n", "auto", "--maxprocesses", "4", "--dist", "loadscope") if name in PARALLEL else ()
        session.run("pytest", path, "-p", "no:cacheprovider", *workers, *marker, *extra, *session.posargs, env=env)


# The gates' tools, pinned: another ruff may format differently, another mypy may find new things.
RUFF = "ruff==0.17.6"
MYPY = "mypy==2.4.1"


def _lint(session: nox.Session) -> None:
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("python", "tools/check_layers.py")


def _typecheck(session: nox.Session) -> None:
    for name in PACKAGES:
        session.run("mypy", f"packages/{name}/src")


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """The CI gate: lint, the layering rule and mypy first (seconds), then every package's tests and the end-to-end
    tests on the real QNN HTP simulator."""
    _install(session)
    session.install(RUFF, MYPY)
    _versions(session)
    _lint(session)
    _typecheck(session)
    _pytest(session)


@nox.session(python=PYTHON)
def demo(session: nox.Session) -> None:
    """Compile a small real model with torch.compile(backend="qnn"), run it on QNN HTP and check it against eager."""
    _install(session, test=False)
    session.run("python", "tools/demo.py", *session.posargs)


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff lint and format check, and the layering rule (leaves never import each other); part of `tests`."""
    session.install(RUFF)
    _lint(session)


@nox.session(python=PYTHON)
def typecheck(session: nox.Session) -> None:
    """mypy on every package's src/ (configuration in the root pyproject.toml); part of `tests`."""
    _install(session)
    session.install(MYPY)
    _typecheck(session)


@nox.session(python=PYTHON, default=False)
@nox.parametrize("torch", MATRIX_TORCH)
@nox.parametrize("ort_qnn", MATRIX_ORT_QNN)
def matrix(session: nox.Session, torch: str, ort_qnn: str) -> None:
    """Opt-in: the suite against torch (2.13, 2.14) x onnxruntime-qnn (2.4-2.7). torch 2.14.1 is a 5.5 GB wheel.

    ``-- smoke`` runs a shorter suite per combination (the backend's unit tests and the end-to-end compile tests)."""
    _install(session, torch=f"torch=={torch}", ort_qnn=f"onnxruntime-qnn=={ort_qnn}")
    _versions(session)
    if session.posargs[:1] == ["smoke"]:
        env = {"HYPOTHESIS_PROFILE": "ci"}
        session.run("pytest", "packages/backend/tests", "-p", "no:cacheprovider", "-m", "not slow", env=env)
        session.run(
            "pytest", "integration-tests/test_compile_e2e.py", "-p", "no:cacheprovider", "-m", "not slow", env=env
        )
        return
    _pytest(session)


@nox.session(python=PYTHON, default=False)
def slow(session: nox.Session) -> None:
    """Opt-in: the slow tests too (the whole export corpus, the full op-table check against the simulator)."""
    _install(session)
    _versions(session)
    _pytest(session, "-m", "slow or not slow")


@nox.session(python=PYTHON, default=False)
def bench(session: nox.Session) -> None:
    """Opt-in: the benchmark harness (qnnx vs raw ORT, eager, OpenVINO and Inductor, then generation with a KV cache,
    then float against quantized graphs, then compile time against a decoder's depth, then a 0.5B-class decoder run as
    parts, then that decoder with the int4 recipe); writes docs/benchmarks.md."""
    _install(session)
    session.install("openvino", "matplotlib")
    _versions(session)
    session.run("python", "tools/bench/run.py", *session.posargs)
    session.run("python", "tools/bench/generation.py")  # these two append their sections to docs/benchmarks.md
    session.run("python", "tools/bench/quantization.py")
    session.run("python", "tools/bench/depth.py")
    session.run("python", "tools/bench/large.py")  # a 0.5B-class decoder: about 6 minutes and 11 GB here
    session.run("python", "tools/bench/large_quant.py")  # its 2-layer cut, llm-a16w4 then float: ~20 min, 6 GB


@nox.session(python=PYTHON, default=False)
def conformance(session: nox.Session) -> None:
    """Opt-in: every float32 OpInfo op through backend="qnn" against eager PyTorch (writes docs/conformance.md),
    then the shape-class suites at depth: every rewrite pass over ranks 1-5 and unit dims on the simulator, and the
    rank sweep of common patterns through torch.compile (about 40 minutes on the 2-core bench). With
    `-- --opcheck-node-tests`: only qnnx-opcheck against ONNX's node tests on the simulator (rewrites its record, the
    tables and docs/operators.md)."""
    _install(session)
    _versions(session)
    if "--opcheck-node-tests" in session.posargs:  # only qnnx-opcheck against ONNX's node tests (~3 minutes)
        session.run("python", "tools/opcheck/node_tests.py", "--record")
        session.run("python", "tools/opcheck/tables.py")
        session.run("python", "tools/opcheck/gen_operators_doc.py")
        return
    session.run("python", "tools/conformance/run.py", *session.posargs)
    wide = {"HYPOTHESIS_PROFILE": "dev", "QNNX_PASS_CONFORMANCE_EXAMPLES": "80", "QNNX_RANK_SWEEP_EXAMPLES": "150"}
    session.run("pytest", "packages/export/tests/test_pass_conformance.py", "-p", "no:cacheprovider", env=wide)
    session.run("pytest", "integration-tests/test_rank_classes.py", "-p", "no:cacheprovider", env=wide)
