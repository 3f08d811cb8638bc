"""mibyan: a terminal AI agent and Python library.

Everything mibyan installs lives under this one name (`mibyan.agent`, `mibyan.tools`, `mibyan.cli`,
`mibyan.config`, `mibyan.gateway`), beside the three public top-level modules `run_agent`, `model_tools`
and `agent_state`, so a project with its own `config.py` or `tools/` never shadows it. In a source
checkout the subpackages are the folders at the repository's top, reached through symbolic links in this
folder; a wheel holds them here.

    from mibyan import AIAgent        # the same class as `from run_agent import AIAgent`
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from run_agent import AIAgent

__all__ = ["AIAgent", "__version__"]


def __getattr__(name: str) -> Any:
    # Lazy, so `import mibyan.cli.main` (the console script) does not import the agent and its SDKs.
    if name == "AIAgent":
        from run_agent import AIAgent

        return AIAgent
    if name == "__version__":
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("mibyan")
        except PackageNotFoundError:
            return "0+unknown"
    raise AttributeError(f"module 'mibyan' has no attribute {name!r}")
