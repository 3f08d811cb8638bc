"""The tool registry: `@tool` turns a typed, documented function into a tool the model can call.

The JSON schema comes from the type hints (through pydantic) and the descriptions from the docstring:
its first paragraph describes the tool to the model, its `Args:` section describes each argument.
A handler that needs its run declares a first parameter typed `RunContext` (tools/context.py): it is
not part of the schema, and the executor passes the call's context there.
The registry is the one piece of module-level mutable state mibyan has.
"""

from __future__ import annotations

import inspect
import re
import types
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import (
    Any,
    NotRequired,
    Required,
    Union,
    get_args,
    get_origin,
    get_type_hints,
    is_typeddict,
)

from mibyan.tools.approval import Verdict
from mibyan.tools.context import RunContext
from mibyan.tools.schema import ToolSchema

ToolHandler = Callable[..., Any]
#: The approval verdict of a call's arguments, in its run (see tools.approval).
VerdictOf = Callable[[dict[str, Any], RunContext], Verdict]
#: What a call does, for the approval question ("read_file /etc/x"), in its run.
SubjectOf = Callable[[dict[str, Any], RunContext], str]


@dataclass(frozen=True)
class ToolSpec:
    """A registered tool.

    Attributes:
        name: what the model calls it.
        toolset: the group it belongs to ("core", "files", ...); toolsets are selected in config.
        handler: the function; called with the model's arguments as keywords (plus `task_id` if it asks),
            after the call's `RunContext` when `takes_context`.
        schema: what the model sees.
        interactive: runs alone and in order (it asks the user something).
        max_result_chars: longer results are cut, with a note saying how much was cut.
        resource: names the argument whose value is the resource a call touches (calls on one
            resource run in order).
        dangerous: a function giving the approval verdict of a call's arguments in its run (see
            tools.approval).
        subject: a function naming, for the approval question, what a call does ("read_file /etc/x");
            without one the question shows the `command` argument, else the arguments as JSON.
        takes_context: the handler's first parameter is its `RunContext`.
        timeout: seconds the executor waits for a call before reporting a timeout; None means the
            default (`agent.tool_timeout`). A tool that enforces its own limit (terminal) still ends.
    """

    name: str
    toolset: str
    handler: ToolHandler
    schema: ToolSchema
    interactive: bool = False
    max_result_chars: int = 50_000
    resource: str | None = None
    dangerous: VerdictOf | None = None
    timeout: float | None = None
    wants_task_id: bool = False
    subject: SubjectOf | None = None
    takes_context: bool = False


_REGISTRY: dict[str, ToolSpec] = {}

_ARG_LINE = re.compile(r"^\s{2,}(\w+)(?:\s*\([^)]*\))?:\s*(.*)$")


def _parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """Split a Google-style docstring into the description and the `Args:` descriptions."""
    lines = inspect.cleandoc(doc).splitlines()
    description: list[str] = []
    args: dict[str, str] = {}
    current: str | None = None
    section: str | None = None
    for line in lines:
        header = line.strip().rstrip(":")
        if (
            line
            and not line[0].isspace()
            and line.strip().endswith(":")
            and header
            in (
                "Args",
                "Arguments",
                "Attributes",
                "Returns",
                "Raises",
                "Examples",
                "Example",
                "Note",
                "Notes",
            )
        ):
            section = header
            current = None
            continue
        if section is None:
            description.append(line)
        elif section in ("Args", "Arguments", "Attributes"):
            match = _ARG_LINE.match(line)
            if match:
                current = match.group(1)
                args[current] = match.group(2).strip()
            elif current and line.strip():
                args[current] += " " + line.strip()
    return "\n".join(description).strip(), args


_SIMPLE_TYPES: dict[Any, dict[str, Any]] = {
    str: {"type": "string"},
    int: {"type": "integer"},
    float: {"type": "number"},
    bool: {"type": "boolean"},
}


def type_schema(annotation: Any) -> dict[str, Any]:
    """The JSON schema of a parameter type. The common types are mapped directly (building a pydantic
    model per tool cost about 3 ms each at start-up); anything else goes through pydantic."""
    if annotation in _SIMPLE_TYPES:
        return dict(_SIMPLE_TYPES[annotation])
    origin, args = get_origin(annotation), get_args(annotation)
    if origin in (types.UnionType, Union) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1:
            return {"anyOf": [type_schema(rest[0]), {"type": "null"}]}
    if origin is list and len(args) == 1:
        return {"type": "array", "items": type_schema(args[0])}
    if origin is dict and len(args) == 2 and args[0] is str:
        return {"type": "object", "additionalProperties": type_schema(args[1])}
    if is_typeddict(annotation):
        return typed_dict_schema(annotation)
    from pydantic import TypeAdapter

    schema = TypeAdapter(annotation).json_schema()
    schema.pop("title", None)
    return schema


def typed_dict_schema(annotation: Any) -> dict[str, Any]:
    """An object with exactly the keys of a TypedDict, described by its docstring's `Attributes:`."""
    _, docs = _parse_docstring(annotation.__doc__ or "")
    properties: dict[str, Any] = {}
    required: list[str] = []
    # Read Required/NotRequired from the hints: with postponed annotations, __required_keys__ cannot see them.
    for key, hint in get_type_hints(annotation, include_extras=True).items():
        marker = get_origin(hint)
        if marker in (Required, NotRequired):
            hint = get_args(hint)[0]
        if marker is Required or (marker is not NotRequired and annotation.__total__):
            required.append(key)
        prop = type_schema(hint)
        if key in docs:
            prop["description"] = docs[key]
        properties[key] = prop
    schema: dict[str, Any] = {"type": "object", "properties": properties, "additionalProperties": False}
    if required:
        schema["required"] = required
    return schema


def takes_context(fn: ToolHandler) -> bool:
    """Whether `fn`'s first parameter is its run context (typed `RunContext`)."""
    first = next(iter(inspect.signature(fn).parameters.values()), None)
    return first is not None and get_type_hints(fn).get(first.name) is RunContext


def build_schema(fn: ToolHandler, name: str) -> ToolSchema:
    """The model-facing schema of `fn`, from its signature, type hints and docstring."""
    description, arg_docs = _parse_docstring(fn.__doc__ or "")
    hints = get_type_hints(fn)
    properties: dict[str, Any] = {}
    required: list[str] = []
    for param in inspect.signature(fn).parameters.values():
        if param.name == "task_id" or param.kind in (param.VAR_KEYWORD, param.VAR_POSITIONAL):
            continue
        if hints.get(param.name) is RunContext:  # the run, passed by the executor: not the model's
            continue
        prop = type_schema(hints.get(param.name, str))
        if param.name in arg_docs:
            prop["description"] = arg_docs[param.name]
        if param.default is inspect.Parameter.empty:
            required.append(param.name)
        else:
            prop["default"] = param.default
        properties[param.name] = prop
    parameters: dict[str, Any] = {"type": "object", "properties": properties, "additionalProperties": False}
    if required:
        parameters["required"] = required
    return ToolSchema(name=name, description=description or name, parameters=parameters)


def tool(
    *,
    toolset: str = "core",
    name: str | None = None,
    interactive: bool = False,
    max_result_chars: int = 50_000,
    resource: str | None = None,
    dangerous: VerdictOf | None = None,
    timeout: float | None = None,
    subject: SubjectOf | None = None,
) -> Callable[[ToolHandler], ToolHandler]:
    """Register the decorated function as a tool (see `ToolSpec` for the options)."""

    def register(fn: ToolHandler) -> ToolHandler:
        tool_name = name or fn.__name__
        _REGISTRY[tool_name] = ToolSpec(
            name=tool_name,
            toolset=toolset,
            handler=fn,
            schema=build_schema(fn, tool_name),
            interactive=interactive,
            max_result_chars=max_result_chars,
            resource=resource,
            dangerous=dangerous,
            timeout=timeout,
            wants_task_id="task_id" in inspect.signature(fn).parameters,
            subject=subject,
            takes_context=takes_context(fn),
        )
        return fn

    return register


def unregister(name: str) -> None:
    """Remove a tool (for callers that register temporary tools)."""
    _REGISTRY.pop(name, None)


def get_tool(name: str) -> ToolSpec | None:
    return _REGISTRY.get(name)


def select_tools(
    toolsets: Iterable[str], *, allow: Iterable[str] = (), deny: Iterable[str] = ()
) -> list[ToolSpec]:
    """The tools of the given toolsets ("all" selects every one), filtered by allow and deny lists."""
    wanted = set(toolsets)
    allowed = set(allow)
    denied = set(deny)
    return [
        spec
        for spec in _REGISTRY.values()
        if ("all" in wanted or spec.toolset in wanted)
        and (not allowed or spec.name in allowed)
        and spec.name not in denied
    ]
