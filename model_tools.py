"""Tool schemas for a toolset selection, and dispatch of one call to its handler.

`handle_function_call` never raises for the model's mistakes: an unknown tool, arguments that are not
JSON or do not fit the schema, or a handler that fails all come back as text the model can act on.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from typing import Any

from mibyan.core.errors import ConfigError, ToolError, ToolFailed
from mibyan.tools import builtin  # noqa: F401  (registers the built-in tools)
from mibyan.tools.context import RunContext
from mibyan.tools.registry import ToolSpec, get_tool, select_tools
from mibyan.tools.schema import ToolSchema

log = logging.getLogger("mibyan.tools")


def known_toolsets() -> list[str]:
    """The toolsets one may select: those of the registered tools, and "all"."""
    return sorted({"all", *(spec.toolset for spec in select_tools(["all"]))})


def check_tool_selection(
    toolsets: Iterable[str],
    *,
    allow: Iterable[str] = (),
    deny: Iterable[str] = (),
    where: str = "tools.toolsets",
) -> None:
    """Refuse toolset and tool names the registry does not know: a typo would silently take tools away.

    Tools of MCP servers (`mcp__<server>__<tool>`) are registered as their servers start, so their names
    are left to the MCP configuration to check.

    Raises:
        ConfigError: naming the unknown name and the known ones.
    """
    toolset_names = known_toolsets()
    for name in toolsets:
        if name not in toolset_names:
            raise ConfigError(f"{where}: unknown toolset {name!r} (known: {', '.join(toolset_names)})")
    tool_names = sorted(spec.name for spec in select_tools(["all"]))
    for key, names in (("allow", allow), ("deny", deny)):
        for name in names:
            if name not in tool_names and not name.startswith("mcp__"):
                raise ConfigError(f"tools.{key}: unknown tool {name!r} (known: {', '.join(tool_names)})")


def get_tool_definitions(
    toolsets: Iterable[str] = ("core",), *, allow: Iterable[str] = (), deny: Iterable[str] = ()
) -> list[ToolSchema]:
    """The schemas the model sees for this selection of toolsets, allow and deny lists."""
    return [spec.schema for spec in select_tools(toolsets, allow=allow, deny=deny)]


def parse_arguments(raw: str | dict[str, Any] | None) -> dict[str, Any]:
    """The model's arguments as a dict. Raises ToolError with a message for the model."""
    if isinstance(raw, dict):
        return raw
    if raw is None or not raw.strip():
        return {}
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ToolError(
            f"the arguments are not valid JSON ({exc.msg} at position {exc.pos}); send a JSON object"
        ) from None
    if not isinstance(parsed, dict):
        raise ToolError("the arguments must be a JSON object")
    return parsed


def check_arguments(spec: ToolSpec, args: dict[str, Any]) -> None:
    """Reject arguments the schema does not allow, with a message the model can act on."""
    properties = spec.schema.parameters.get("properties", {})
    unknown = sorted(set(args) - set(properties))
    # built-in tools never take more; an MCP server's schema may allow more, and the server checks them
    if unknown and spec.schema.parameters.get("additionalProperties", True) is False:
        raise ToolError(
            f"unknown argument(s) {', '.join(unknown)}; {spec.name} takes: "
            f"{', '.join(properties) or 'no arguments'}"
        )
    missing = [n for n in spec.schema.parameters.get("required", []) if n not in args]
    if missing:
        raise ToolError(f"missing required argument(s): {', '.join(missing)}")


def run_tool(spec: ToolSpec, args: dict[str, Any], ctx: RunContext) -> str:
    """Call the handler in the run `ctx`; its failures raise ToolError with a message for the model."""
    check_arguments(spec, args)
    kwargs = dict(args)
    if spec.wants_task_id:
        kwargs["task_id"] = ctx.task_id
    try:
        result = spec.handler(ctx, **kwargs) if spec.takes_context else spec.handler(**kwargs)
    except ToolError:
        raise
    except Exception as exc:  # a tool boundary: the failure becomes text for the model
        log.warning("tool %s raised %s", spec.name, exc, exc_info=True)
        raise ToolError(f"{type(exc).__name__}: {exc}") from exc
    if result is None:
        return ""
    return result if isinstance(result, str) else json.dumps(result, ensure_ascii=False, default=str)


def handle_function_call(name: str, args: str | dict[str, Any] | None, task_id: str | None = None) -> str:
    """Run one tool call and return its result as text; errors come back as "error: ..." text.

    It runs outside any agent: in the process's working directory, unconfined, for the home of
    `mibyan_home()`, and only what needs nobody's approval.
    """
    spec = get_tool(name)
    if spec is None:
        return f"error: unknown tool {name!r}"
    ctx = RunContext(task_id=task_id)
    try:
        parsed = parse_arguments(args)
        if spec.dangerous is not None:
            # No one to ask here: only an agent (with its approval policy) may run what needs approval.
            verdict = spec.dangerous(parsed, ctx)
            if verdict.tier != "safe":
                raise ToolError(f"not run: {verdict.reason}; this needs the user's approval")
        return run_tool(spec, parsed, ctx)
    except ToolFailed as exc:  # it ran but was stopped: the whole result, as it is
        return str(exc)
    except ToolError as exc:
        return f"error: {exc}"
