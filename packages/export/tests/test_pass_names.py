"""The pass names read from the declarations' source: the same as a full parse of the modules, and the registry."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from qnnx_export import _pass_names
from qnnx_export._pass_names import declared_passes


def _full_parse(folder: Path) -> tuple[str, ...]:
    """The reading by a parse of each whole module (every top-level class's ``@register(order=N)`` and ``name``)."""
    declared = []
    for path in sorted(folder.glob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if not isinstance(node, ast.ClassDef):
                continue
            for deco in node.decorator_list:
                if (
                    isinstance(deco, ast.Call)
                    and getattr(deco.func, "id", getattr(deco.func, "attr", "")) == "register"
                ):
                    order = next(k.value.value for k in deco.keywords if k.arg == "order")  # type: ignore[attr-defined]
                    name = next(
                        s.value.value  # type: ignore[attr-defined]
                        for s in node.body
                        if isinstance(s, ast.Assign | ast.AnnAssign)
                        and any(
                            getattr(t, "id", None) == "name"
                            for t in getattr(s, "targets", [getattr(s, "target", None)])
                        )
                    )
                    declared.append((order, name))
    return tuple(name for _, name in sorted(declared))


def test_the_package_passes_read_as_a_full_parse_reads_them() -> None:
    """The cheap reading of qnnx-export's own pass modules gives the full parse's names, in the same order."""
    folder = Path(_pass_names.__file__).with_name("_passes")
    assert declared_passes.__wrapped__(folder) == _full_parse(folder)


_NAMES = st.from_regex(r"[a-z][a-z0-9_]{0,15}", fullmatch=True)
_BEFORE_NAME = st.sampled_from(
    [
        "",
        '    """One line."""\n',
        '    """A docstring\n\n    over several lines, name = "not_this".\n    """\n',
        "    # a comment\n",
        "    order_hint: int = 3\n",
    ]
)
_AFTER_NAME = st.sampled_from(
    [
        "",
        '    defect = "a QNN defect"\n',
        "\n    def rewrite(self, graph):\n        name = 'local'\n        return False\n",
    ]
)
_BETWEEN = st.sampled_from(["\n\n", "\n\nHELPER = 1\n\n\n", "\n\ndef helper():\n    return 1\n\n\n", "\n\n@other\n"])


@st.composite
def _modules(draw: st.DrawFn) -> list[str]:
    """Pass modules as source text: classes with ``@register(order=N)`` and a ``name``, with code around them."""
    count = draw(st.integers(1, 6))
    names = draw(st.lists(_NAMES, min_size=count, max_size=count, unique=True))
    orders = draw(st.lists(st.integers(0, 10_000), min_size=count, max_size=count, unique=True))
    files: list[str] = [""]
    for name, order in zip(names, orders, strict=True):
        deco = draw(st.sampled_from([f"@register(order={order})\n", f"@_base.register(\n    order={order},\n)\n"]))
        annotated = draw(st.booleans())
        declaration = f'    name: str = "{name}"\n' if annotated else f'    name = "{name}"\n'
        body = draw(_BEFORE_NAME) + declaration + draw(_AFTER_NAME)
        files[-1] += draw(_BETWEEN) + deco + f"class P{order}(QnnPass):\n" + body
        if draw(st.booleans()):
            files.append("")
    return [f for f in files if f]


@given(modules=_modules())
def test_the_cheap_reading_agrees_with_a_full_parse(
    modules: list[str], tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Whatever surrounds the declarations (docstrings, comments, methods, helpers, other decorated functions), the
    reading of the declaration heads gives a full parse's names in ``order``."""
    folder = tmp_path_factory.mktemp("passes")
    for k, text in enumerate(modules):
        (folder / f"_family{k}.py").write_text(text, encoding="utf-8")
    assert declared_passes.__wrapped__(folder) == _full_parse(folder)


def test_a_declaration_without_a_name_is_refused(tmp_path: Path) -> None:
    """A registered class that sets no ``name`` literal stops the reading with the class and the fix."""
    (tmp_path / "_family.py").write_text("@register(order=5)\nclass Nameless(QnnPass):\n    pass\n\n\nX = 1\n")
    with pytest.raises(ImportError, match="Nameless declares no name"):
        declared_passes.__wrapped__(tmp_path)
