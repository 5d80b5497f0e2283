"""docs/api.md against the code: every public name of ``reader``, ``reader.service`` and ``beam_jobs`` is on the
page with the signature it has, and every entry point a user calls says what each of its parameters is.

The page's entries are what ``api_entry`` renders (a heading, the signature, the docstring's first line), so a name
added to an ``__all__`` or a changed signature fails here, printing the entry to paste.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import inspect
import re

import pytest

from tests import helpers

PAGE = helpers.REPO_ROOT / "docs" / "api.md"
MODULES = ("reader", "reader.service", "beam_jobs")
#: Signatures longer than this are shown a parameter per line.
ONE_LINE = 100


def public_names() -> list[tuple[str, str, object]]:
    """(module, name, object) for every name in the ``__all__`` of ``MODULES``."""
    found = []
    for module_name in MODULES:
        module = importlib.import_module(module_name)
        found += [(module_name, name, getattr(module, name)) for name in module.__all__]
    return found


def _parameters(obj) -> list[inspect.Parameter]:
    signature = inspect.signature(obj)
    return [p for p in signature.parameters.values() if p.name != "self"]


def _rendered(qualified: str, obj) -> str:
    """``qualified(a, b=1, *, c=None)``: names and defaults (annotations are in the docstrings' Args)."""
    parts, keyword_only_marked = [], False
    for parameter in _parameters(obj):
        if parameter.kind is parameter.KEYWORD_ONLY and not keyword_only_marked:
            parts.append("*")
            keyword_only_marked = True
        if parameter.kind is parameter.VAR_POSITIONAL:
            parts.append(f"*{parameter.name}")
            keyword_only_marked = True
        elif parameter.kind is parameter.VAR_KEYWORD:
            parts.append(f"**{parameter.name}")
        elif parameter.default is parameter.empty:
            parts.append(parameter.name)
        else:
            parts.append(f"{parameter.name}={parameter.default!r}")
    line = f"{qualified}({', '.join(parts)})"
    if len(line) <= ONE_LINE:
        return line
    return f"{qualified}(\n" + "".join(f"    {part},\n" for part in parts) + ")"


def _is_error(obj) -> bool:
    return inspect.isclass(obj) and issubclass(obj, BaseException)


def api_entry(module: str, name: str, obj) -> str:
    """The page's entry for one public name."""
    qualified = f"{module}.{name}"
    if not callable(obj):
        return f"### `{qualified}`\n\n{type(obj).__name__}: see the module's docstring.\n"
    summary = (inspect.getdoc(obj) or "").split("\n\n")[0].replace("\n", " ")
    if _is_error(obj):
        bases = ", ".join(base.__name__ for base in obj.__bases__)
        return f"### `{qualified}`\n\n```text\nclass {qualified}({bases})\n```\n\n{summary}\n"
    if inspect.isclass(obj) and issubclass(obj, enum.Enum):
        members = ", ".join(member.name for member in obj)
        return f"### `{qualified}`\n\n```text\nclass {qualified}: {members}\n```\n\n{summary}\n"
    prefix = "class " if inspect.isclass(obj) else ""
    return f"### `{qualified}`\n\n```text\n{prefix}{_rendered(qualified, obj)}\n```\n\n{summary}\n"


def test_every_public_name_is_on_the_api_page_as_the_code_has_it():
    page = PAGE.read_text()
    stale = [api_entry(*public) for public in public_names() if api_entry(*public) not in page]
    assert not stale, "docs/api.md lacks (or has another version of) these entries; paste them:\n\n" + "\n".join(stale)


def test_the_api_page_lists_nothing_that_is_gone():
    listed = set(re.findall(r"^### `([\w.]+)`", PAGE.read_text(), re.MULTILINE))
    public = {f"{module}.{name}" for module, name, _ in public_names()}
    assert listed <= public, f"docs/api.md lists names that are no longer public: {sorted(listed - public)}"


#: Public names a user never constructs or calls with arguments of their own: what the entry points return
#: (iterators, datasets, specs, stats), and the dispatcher's state machine and its leases, exported for tests.
RETURNED = {
    "reader.DistributedDataset",
    "reader.ReaderIterator",
    "reader.InputStats",
    "reader.Snapshot",
    "reader.TensorSpec",
    "reader.ShardPolicy",
    "reader.service.DispatchState",
    "reader.service.Lease",
    "beam_jobs.FinalizeOutcome",
}


#: Classes whose public methods users call with arguments (the option groups' are their fields; ``WriteSnapshot``'s
#: ``expand`` is Beam's).
METHODS_CALLED = {
    "reader.DistributedDataset",
    "reader.ReaderIterator",
    "reader.InputStats",
    "reader.Snapshot",
    "reader.TensorSpec",
    "reader.service.DispatchServer",
    "reader.service.WorkerServer",
}


def entry_points() -> list[tuple[str, object]]:
    """Every public function, every class a user constructs and the methods users call, with what its docstring
    must explain."""
    found = []
    for module, name, obj in public_names():
        qualified = f"{module}.{name}"
        if qualified in METHODS_CALLED:
            found += [
                (f"{qualified}.{method}", function)
                for method, function in vars(obj).items()
                if not method.startswith("_") and inspect.isfunction(function) and _parameters(function)
            ]
        if not callable(obj) or _is_error(obj) or qualified in RETURNED:
            continue
        found.append((qualified, obj))
    return found


def documented_args(obj) -> set[str]:
    """The parameter names an ``Args:`` section (Google style) of the object's or its ``__init__``'s docstring names."""
    docs = [inspect.getdoc(obj) or ""]
    if inspect.isclass(obj) and "__init__" in vars(obj):
        docs.append(inspect.getdoc(obj.__init__) or "")
    names = set()
    for doc in docs:
        section = re.search(r"^Args:\n((?:(?: {4}.*)?\n?)+)", doc, re.MULTILINE)
        if section:
            names |= set(re.findall(r"^ {4}\**(\w+)(?: \(.*?\))?:", section.group(1), re.MULTILINE))
    return names


@pytest.mark.parametrize(("qualified", "obj"), entry_points(), ids=[q for q, _ in entry_points()])
def test_every_entry_point_has_an_args_section_naming_each_parameter(qualified, obj):
    wanted = {p.name for p in _parameters(obj) if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
    if dataclasses.is_dataclass(obj):
        wanted |= {field.name for field in dataclasses.fields(obj) if field.init}
    missing = wanted - documented_args(obj)
    assert not missing, f"{qualified}: its docstring's Args: section does not name {sorted(missing)}"


def test_the_args_check_sees_a_missing_parameter():
    def documented(first, second):
        """Does a thing.

        Args:
            first: the first.
        """

    assert documented_args(documented) == {"first"}
