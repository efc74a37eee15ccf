"""Writes docs/reference.md, the API reference of svc_sdk, from the docstrings.

python scripts/gen_reference.py          # rewrite docs/reference.md
python scripts/gen_reference.py --check  # exit 1 if it is out of date (a test runs this)
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import re
import sys
from pathlib import Path

OUT = Path(__file__).parents[1] / "docs" / "reference.md"
UNDOCUMENTED = "(undocumented)"  # a test fails while the reference contains this

# What the reference covers, in reading order: the public API, then the adapters and
# integrations people import by module.
SECTIONS: list[tuple[str, str, list[str] | None]] = [
    ("svc_sdk", "The client library", None),  # None: the module's __all__
    (
        "svc_sdk.adapters.a2a",
        "A2A adapter and agent cards",
        ["SvcA2AAdapter", "with_svc_extension", "find_svc_extension"],
    ),
    (
        "svc_sdk.adapters.a2a_rpc",
        "A2A client transport and server",
        ["SvcA2AClientTransport", "register_svc_transport", "SvcA2AServer"],
    ),
    ("svc_sdk.adapters.mcp", "MCP", ["SvcTransport", "SvcMCPTransport", "serve_mcp"]),
    ("svc_sdk.adapters.slim", "SLIM", ["SLIMAdapter"]),
    ("svc_sdk.adapters.bridge", "Protocol bridge", ["ProtocolBridge"]),
    ("svc_sdk.testing", "Local stack", ["LocalStack"]),
    ("svc_integrations.langchain", "LangChain toolkit", ["SvcToolkit", "SvcTool"]),
    (
        "svc_integrations.mcp_server",
        "MCP tool server (svc mcp)",
        ["build_server", "Connection", "main"],
    ),
    ("svc_integrations.a2a_agent", "A2A agent", ["SvcA2AAgent"]),
    (
        "svc_integrations.a2a_echo",
        "A2A echo agent (svc-a2a-echo)",
        ["EchoExecutor", "echo_card", "main"],
    ),
    ("svc_integrations.testing", "Scripted chat model", ["ScriptedChatModel"]),
]


def _doc(obj: object) -> str:
    # The object's own docstring: inspect.getdoc would fall back to a base class's, which
    # for a LangChain or pydantic subclass documents the framework, not svc.
    return inspect.cleandoc(getattr(obj, "__doc__", None) or UNDOCUMENTED)


# Classes the library hands out and users never construct: their constructors take the
# library's plumbing (a Channel comes from SvcClient), so the heading shows no signature.
HANDED_OUT = {"Channel", "MessageIterator"}


def _signature(obj: object) -> str:
    if inspect.isclass(obj) and obj.__name__ in HANDED_OUT:
        return ""
    if inspect.isclass(obj) and hasattr(obj, "model_fields"):
        # A pydantic model: its own fields, not the whole inherited constructor.
        own = [n for n in getattr(obj, "__annotations__", {}) if not n.startswith("_")]
        return f"(*, {', '.join(own)}, ...)" if own else ""
    try:
        signature = inspect.signature(obj)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return ""
    # Private keyword parameters (a leading underscore) are plumbing, not API.
    public = [p for p in signature.parameters.values() if not p.name.startswith("_")]
    text = str(signature.replace(parameters=public))
    return re.sub(r" at 0x[0-9a-f]+", "", text)


def _overridden(cls: type, name: str) -> str | None:
    """For a method without a docstring of its own that implements a framework's
    interface: which base method, named rather than its docstring copied."""
    for base in cls.__mro__[1:]:
        if name in vars(base) and not base.__module__.startswith(("svc_", "builtins")):
            return f"Implements `{base.__module__}.{base.__qualname__}.{name}`."
    return None


def _members(cls: type) -> list[tuple[str, object]]:
    out = []
    for name, member in vars(cls).items():
        if name.startswith("_") and name not in ("__init__", "__call__"):
            continue
        if name.startswith("_") and not getattr(member, "__doc__", None):
            continue  # an undocumented constructor: the class heading has its signature
        if isinstance(member, property) or inspect.isfunction(member):
            out.append((name, member))
    return out


def render() -> str:
    lines = [
        "# API reference",
        "",
        "Generated from the docstrings by `scripts/gen_reference.py`; a test keeps it current.",
        "Guides: [client.md](client.md), [protocols.md](protocols.md).",
        "",
    ]
    for module_name, title, names in SECTIONS:
        module = importlib.import_module(module_name)
        lines += [f"## {title} (`{module_name}`)", ""]
        for name in names if names is not None else sorted(module.__all__):
            if name.startswith("__"):
                continue
            obj = getattr(module, name)
            if inspect.isclass(obj):
                kind = "exception" if issubclass(obj, BaseException) else "class"
                lines += [f"### {kind} `{name}{_signature(obj)}`", "", _doc(obj), ""]
                for member_name, member in _members(obj):
                    if isinstance(member, property):
                        lines += [f"- **`{member_name}`** (property): {_doc(member)}"]
                    else:
                        sig = _signature(member).replace("(self, ", "(").replace("(self)", "()")
                        own = getattr(member, "__doc__", None)
                        doc = _doc(member) if own else _overridden(obj, member_name) or _doc(member)
                        doc = doc.replace("\n", "\n  ")
                        lines += [f"- **`{member_name}{sig}`**: {doc}"]
                lines.append("")
            elif callable(obj):
                lines += [f"### `{name}{_signature(obj)}`", "", _doc(obj), ""]
    return "\n".join(lines).rstrip() + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true")
    text = render()
    if parser.parse_args().check:
        if OUT.read_text() != text:
            print(f"{OUT} is out of date: run python scripts/gen_reference.py", file=sys.stderr)
            return 1
        missing = [line for line in text.splitlines() if UNDOCUMENTED in line]
        if missing:
            print("undocumented public API:\n" + "\n".join(missing), file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
