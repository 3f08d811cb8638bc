"""The program's put-off re-exports (core/lean_imports.py): a package whose `__init__` only re-exports
its modules' names is imported without running it, and each name means, at its first use, what the
`__init__` would have made it. Each case runs in a fresh interpreter, where the finder is installed."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import ROOT

from mibyan.core.lean_imports import reexports


def run_python(code: str, *, path: Path | None = None) -> str:
    paths = [str(ROOT), *([str(path)] if path is not None else [])]
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": ":".join(paths), "PATH": "/usr/bin:/bin"},
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture
def packages(tmp_path: Path) -> Path:
    """`shapes`: re-exports only (from a module, a module of a subpackage, and the subpackage itself);
    `noisy`: an `__init__` that also does something, which must run as usual."""
    shapes = tmp_path / "shapes"
    (shapes / "solid").mkdir(parents=True)
    (shapes / "__init__.py").write_text(
        '"""Shapes."""\nfrom __future__ import annotations\n\n'
        "from .flat import Square as Square, Circle\n"
        "from .solid.cube import Cube as Box\n"
        "from . import solid\n"
    )
    (shapes / "flat.py").write_text(
        "import builtins\nbuiltins.FLAT_IMPORTED = True\nclass Square: pass\nclass Circle: pass\n"
    )
    (shapes / "solid" / "__init__.py").write_text("")
    (shapes / "solid" / "cube.py").write_text("class Cube: pass\n")
    noisy = tmp_path / "noisy"
    noisy.mkdir()
    (noisy / "__init__.py").write_text(
        "from .part import thing as thing\nimport builtins\nbuiltins.NOISY = 1\n"
    )
    (noisy / "part.py").write_text("thing = 'a thing'\n")
    return tmp_path


def test_a_put_off_package_imports_a_module_at_the_first_use_of_its_name(packages: Path) -> None:
    out = run_python(
        """
        import builtins, sys
        from mibyan.core.lean_imports import put_off_reexports
        put_off_reexports(("shapes", "noisy"))
        import shapes
        print("flat before use:", "shapes.flat" in sys.modules)
        from shapes import Square
        import shapes.flat
        print("flat after use:", getattr(builtins, "FLAT_IMPORTED", False), Square is shapes.flat.Square)
        print("alias:", shapes.Box is __import__("shapes.solid.cube").solid.cube.Cube)
        print("subpackage:", shapes.solid is sys.modules["shapes.solid"])
        print("listed:", {"Square", "Circle", "Box", "solid", "flat"} <= set(dir(shapes)))
        try:
            shapes.Triangle
        except AttributeError as exc:
            print("unknown:", exc)
        import noisy
        print("noisy ran:", builtins.NOISY, noisy.thing)
        namespace = {}
        exec("from shapes import *", namespace)
        print("star:", sorted(name for name in namespace if not name.startswith("__")))
        print("no __all__:", hasattr(shapes, "__all__"))
        """,
        path=packages,
    )
    assert out.splitlines() == [
        "flat before use: False",
        "flat after use: True True",
        "alias: True",
        "subpackage: True",
        "listed: True",
        "unknown: module 'shapes' has no attribute 'Triangle'",
        "noisy ran: 1 a thing",
        "star: ['Box', 'Circle', 'Square', 'annotations', 'flat', 'solid']",
        "no __all__: False",
    ]


def test_the_sdks_classes_a_star_import_brings_are_there_put_off() -> None:
    """anthropic's `__init__` star-imports two put-off packages (its Vertex and Bedrock clients)."""
    out = run_python(
        """
        from mibyan.core.lean_imports import put_off_reexports
        put_off_reexports()
        import anthropic
        from anthropic import AnthropicVertex, AnthropicBedrock
        print(AnthropicVertex.__name__, AnthropicBedrock.__name__)
        """
    )
    assert out.strip() == "AnthropicVertex AnthropicBedrock"


def test_an_import_hook_put_before_the_path_finder_still_sees_the_sdks_packages_first() -> None:
    """Instrumentation libraries watch imports with a finder of their own ahead of the path finder."""
    out = run_python(
        """
        import sys
        seen = []
        class Watching:
            def find_spec(self, name, path=None, target=None):
                if name.startswith("openai.types"):
                    seen.append(name)
                return None
        sys.meta_path.insert(0, Watching())
        from mibyan.core.lean_imports import put_off_reexports
        put_off_reexports()
        import openai
        print("openai.types.chat" in seen, "openai.types.batch" in sys.modules)
        """
    )
    assert out.split() == ["True", "False"]


def test_a_process_that_did_not_ask_imports_the_packages_as_they_are(packages: Path) -> None:
    out = run_python(
        "import sys, shapes, mibyan.core.lean_imports\nprint('shapes.flat' in sys.modules)", path=packages
    )
    assert out.strip() == "True"


def test_every_name_of_the_sdks_types_put_off_is_what_it_is_when_imported_whole() -> None:
    """Each name openai's types and helper packages have (here and below), imported whole, resolves put
    off to an object of the same module and name: those the `__init__`s bind, and the submodules other
    modules' imports bind in them."""
    whole = run_python(
        """
        import openai, openai.lib, openai.types
        named = lambda v: getattr(v, "__qualname__", None) or getattr(v, "__name__", type(v).__name__)
        seen = {}
        def visit(package):
            for name in sorted(dir(package)):
                value = getattr(package, name)
                if not name.startswith("__"):
                    where = getattr(value, "__module__", None)
                    seen[f"{package.__name__}.{name}"] = (where, named(value))
                if hasattr(value, "__path__") and value.__name__.startswith(package.__name__ + "."):
                    visit(value)
        visit(openai.types)
        visit(openai.lib)
        print(repr(seen))
        """
    )
    names = ast.literal_eval(whole)
    put_off = run_python(
        f"""
        import functools, sys
        from mibyan.core.lean_imports import put_off_reexports
        put_off_reexports()
        import openai, openai.types
        assert "openai.types.batch" not in sys.modules  # put off indeed
        named = lambda v: getattr(v, "__qualname__", None) or getattr(v, "__name__", type(v).__name__)
        seen = {{}}
        for dotted in {sorted(names)!r}:
            value = functools.reduce(getattr, dotted.split(".")[1:], openai)
            seen[dotted] = (getattr(value, "__module__", None), named(value))
        print(repr(seen))
        """
    )
    assert len(names) > 500
    assert ast.literal_eval(put_off) == names


@pytest.mark.parametrize(
    "source",
    [
        "import os\nfrom .a import A\n",
        "from .a import *\n",
        "from .a import A\nVALUE = 1\n",
        "from ..elsewhere import B\n",
        "if True:\n    from .a import A\n",
        "from .a import (\n",
        # a name that is both a submodule and a value of one: the value, once the `__init__` ran
        "from .thing import thing as thing\n",
        "from .z import x\nfrom .x import A\n",
    ],
)
def test_an_init_that_does_more_than_re_export_is_not_put_off(source: str) -> None:
    assert reexports(source) is None


def test_an_init_of_re_exports_names_what_each_name_comes_from() -> None:
    source = '"""Doc."""\nfrom __future__ import annotations\nfrom .a.b import C as D, E\nfrom . import f\n'
    assert reexports(source) == {
        "annotations": ("__future__", "annotations"),
        "a": (".", "a"),
        "D": (".a.b", "C"),
        "E": (".a.b", "E"),
        "f": (".", "f"),
    }
