"""What the `mibyan` program's own process leaves out of, or puts off in, the libraries it imports.

Two kinds, both only in the program's process (a library user's process is left as it is):

- Optional extras of those libraries that mibyan never uses (`leave_out_unused`). When installed, the
  model SDKs import aiohttp (for an async client mibyan never makes) and the HTTP transport imports h2
  (HTTP/2, which mibyan never turns on). They came with other extras (the Matrix connector needs
  aiohttp) and cost every start 0.1 s and 11 MiB. The program leaves them out at its start, while it runs
  one thread; whatever needs one takes it back first (`take_back`), and so imports it as usual.
- The model SDKs' packages of types (`put_off_reexports`). The SDK's `__init__` imports its `types`
  package, whose `__init__` imports every type the API has (hundreds of pydantic models: half of
  `import openai`, 0.5 s of a one-shot on a slow machine), where a chat needs a few dozen. A package whose
  `__init__` does nothing but re-export names of its modules is put off: each name imports its module
  when it is first used, and means what it meant.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import sys
from collections.abc import Iterable, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    import importlib.abc

UNUSED = ("aiohttp", "h2")
#: The packages (and those below them) whose re-exports are put off: the SDKs' types and helpers. Their
#: `resources` already load on use; a package that does more than re-export is imported as usual.
PUT_OFF = ("openai.types", "openai.lib", "anthropic.types", "anthropic.lib")


def leave_out_unused() -> None:
    """From now on an `import` of an UNUSED extra fails (libraries that find it missing do without it),
    until it is taken back. Extras imported already stay."""
    for name in UNUSED:
        if name not in sys.modules:
            sys.modules[name] = None  # type: ignore[assignment]  # the import system's "not importable"


def take_back(names: Iterable[str]) -> None:
    """Let `names` be imported again (a connector whose library needs them)."""
    for name in names:
        if name in sys.modules and sys.modules[name] is None:
            del sys.modules[name]


def put_off_reexports(packages: Sequence[str] = PUT_OFF) -> None:
    """From now on a package among `packages` (or below one) whose `__init__` only re-exports is imported
    without running it: each of its names imports what it names at its first use. Packages imported
    already stay as they are. Once per process."""
    if any(isinstance(finder, _ReexportsPutOff) for finder in sys.meta_path):
        return
    # just before the path finder: whatever finder another program put ahead of it (an import hook of
    # an instrumentation library, say) still sees these packages first, as it would without this one
    path_finder = importlib.machinery.PathFinder  # in the list as the class itself
    at = next((i for i, finder in enumerate(sys.meta_path) if finder is path_finder), len(sys.meta_path))
    sys.meta_path.insert(at, _ReexportsPutOff(tuple(packages)))


#: A package's names: each to the module it comes from (relative, as the `__init__` wrote it) and the
#: name there; (".", name) for a submodule of its own (which an import binds in its package too).
Reexports = dict[str, tuple[str, str]]


def reexports(source: str) -> Reexports | None:
    """The names a package's `__init__` source binds, when all it does is re-export names of its own
    modules (`from .x import A as A`, after a docstring and `from __future__`); None when it does more."""
    import ast  # only once a package is put off: `mibyan --help` imports none

    try:
        body = ast.parse(source).body
    except SyntaxError:
        return None
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    names: Reexports = {}
    modules: set[str] = set()  # the submodules its imports bind, by their name in the package
    values: set[str] = set()  # the names it binds to what a module holds
    for statement in body:
        if isinstance(statement, ast.ImportFrom) and statement.module == "__future__":
            names.update({alias.name: ("__future__", alias.name) for alias in statement.names})
            continue
        if not isinstance(statement, ast.ImportFrom) or statement.level != 1:
            return None
        if any(alias.name == "*" for alias in statement.names):
            return None
        module = statement.module or ""
        if module:  # `from .x.y import A` binds `x` in the package as well
            modules.add(module.split(".")[0])
            names.setdefault(module.split(".")[0], (".", module.split(".")[0]))
            values.update(alias.asname or alias.name for alias in statement.names)
        for alias in statement.names:
            names[alias.asname or alias.name] = (f".{module}", alias.name)
    # A name both a submodule and what a module holds (`from .thing import thing`) is the value once the
    # `__init__` has run, whatever imports that submodule later; put off, an import of the submodule
    # elsewhere would bind the submodule first, and the value would never be looked for.
    return None if modules & values else names


class _ReexportsPutOff:
    """Finds the put-off packages where the usual path finder would, and loads them without their code
    (a meta path finder and its loader; importlib.abc would cost `mibyan --help` 50 ms to name them)."""

    def __init__(self, packages: tuple[str, ...]) -> None:
        self.packages = packages

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if not any(fullname == p or fullname.startswith(f"{p}.") for p in self.packages):
            return None
        # what the path finder, next in line, would find: returned as it is when not put off, so the
        # SDKs' hundreds of modules are looked for once
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.submodule_search_locations is None:
            return spec
        loader = spec.loader
        if not isinstance(loader, importlib.machinery.SourceFileLoader):
            return spec
        try:
            source = loader.get_source(fullname)
        except (ImportError, OSError):
            return spec
        names = reexports(source or "")
        if names is None:
            return spec
        spec.loader = cast("importlib.abc.Loader", self)
        spec.loader_state = names
        return spec

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None  # the usual module object

    def exec_module(self, module: ModuleType) -> None:
        names: Reexports = module.__spec__.loader_state  # type: ignore[union-attr]
        package = module.__name__

        def __getattr__(name: str) -> object:
            if name == "__all__":
                # `from package import *`, which, the package having no `__all__`, then takes the public
                # names in its namespace: all of them are bound first, as the `__init__` would have
                for each in names:
                    if each not in module.__dict__:
                        __getattr__(each)
                raise AttributeError(f"module {package!r} has no attribute '__all__'")
            if name in names:
                where, attribute = names[name]
            elif not name.startswith("__"):
                # perhaps a submodule it does not name, which an import of one of its names binds in it
                # when imported whole; put off, it is imported when asked for
                where, attribute = ".", name
            else:
                raise AttributeError(f"module {package!r} has no attribute {name!r}")
            if where == ".":
                try:
                    value: object = importlib.import_module(f"{package}.{attribute}")
                except ModuleNotFoundError as exc:
                    if exc.name != f"{package}.{attribute}":
                        raise  # the submodule is there, and something it imports is not
                    raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
            else:
                value = getattr(importlib.import_module(where, package), attribute)
            # two threads may both get here: each imports the same module (the import system's locks)
            # and binds the same object, as the `__init__` would have once
            module.__dict__[name] = value
            return value

        def __dir__() -> list[str]:
            return sorted({*module.__dict__, *names})

        module.__getattr__ = __getattr__  # type: ignore[method-assign]
        module.__dir__ = __dir__  # type: ignore[method-assign]
