"""A repository check: every finalizer in the tree only signals.

A finalizer runs wherever the garbage collector happens to run, inside any code of any thread: one that
took a lock, submitted to a pool or joined a thread once deadlocked a whole process
(``reader.core.reaper`` says how). This lists every ``__del__`` and every callback given to
``weakref.finalize``, ``weakref.ref`` or ``multiprocessing.util.Finalize`` (with an object) in the tree
and fails on one whose body does anything but signal: set an attribute or an item (a flag), put to a
``queue.SimpleQueue``, or call a function of the tree that does only that. Work a dropped object leaves
goes through ``reaper.on_collect``, whose own finalizer is checked here like any other.
"""

import ast
import dataclasses
import pathlib
import textwrap

from tests import helpers

TREES = ("reader", "schemas", "beam_jobs", "bench", "examples", "tests")
#: Methods of a ``queue.SimpleQueue`` that are made to be called from finalizers.
SIGNAL_METHODS = {"put", "put_nowait"}
FINALIZER_CALLS = {
    ("weakref", "finalize"),
    ("weakref", "ref"),
    ("util", "Finalize"),
    ("multiprocessing.util", "Finalize"),
}


@dataclasses.dataclass
class Module:
    path: str
    tree: ast.Module

    def functions(self) -> dict[str, list[ast.FunctionDef]]:
        found: dict[str, list[ast.FunctionDef]] = {}
        for node in ast.walk(self.tree):
            if isinstance(node, ast.FunctionDef):
                found.setdefault(node.name, []).append(node)
        return found

    def simple_queues(self) -> set[str]:
        """Names and attributes assigned a ``queue.SimpleQueue()`` anywhere in the module."""
        names = set()
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Assign | ast.AnnAssign) and _is_simple_queue(node.value):
                for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    names.update(_target_names(target))
        return names


def _is_simple_queue(value) -> bool:
    if not isinstance(value, ast.Call):
        return False
    func = value.func
    return (isinstance(func, ast.Attribute) and func.attr == "SimpleQueue") or (
        isinstance(func, ast.Name) and func.id == "SimpleQueue"
    )


def _target_names(target) -> set[str]:
    if isinstance(target, ast.Name):
        return {target.id}
    if isinstance(target, ast.Attribute):
        return {target.attr}
    if isinstance(target, ast.Tuple):
        return set().union(*(_target_names(element) for element in target.elts))
    return set()


def _dotted(node) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return None if inner is None else f"{inner}.{node.attr}"
    return None


class Checker:
    """Finds the finalizers of a set of modules and says what each one does that a signal does not."""

    def __init__(self, modules: list[Module]) -> None:
        self.modules = modules
        self.tree_functions: dict[str, list[ast.FunctionDef]] = {}
        for module in modules:
            for name, defs in module.functions().items():
                self.tree_functions.setdefault(name, []).extend(defs)

    def finalizers(self) -> list[tuple[str, str, list[str]]]:
        """(where, what, problems) for every finalizer found."""
        found = []
        for module in self.modules:
            queues = module.simple_queues()
            local = module.functions()
            for node in ast.walk(module.tree):
                if isinstance(node, ast.ClassDef):
                    for item in node.body:
                        if isinstance(item, ast.FunctionDef) and item.name == "__del__":
                            where = f"{module.path}:{item.lineno}"
                            found.append((where, f"{node.name}.__del__", self._body(item, queues, local, set())))
                if isinstance(node, ast.Call) and self._is_finalizer_call(node):
                    where = f"{module.path}:{node.lineno}"
                    callback = node.args[1] if len(node.args) > 1 else None
                    found.append((where, ast.unparse(node), self._callback(callback, queues, local, node, module)))
        return found

    @staticmethod
    def _is_finalizer_call(call: ast.Call) -> bool:
        func = call.func
        dotted = _dotted(func.value) if isinstance(func, ast.Attribute) else None
        if isinstance(func, ast.Attribute) and (dotted, func.attr) in FINALIZER_CALLS:
            if func.attr == "ref" and len(call.args) < 2:
                return False  # a plain weak reference: no callback
            first = call.args[0] if call.args else None
            return not (isinstance(first, ast.Constant) and first.value is None)  # Finalize(None, ...): at exit only
        return False

    def _callback(self, callback, queues, local, call, module) -> list[str]:
        if callback is None:
            return ["no callback found"]
        if isinstance(callback, ast.Attribute) and callback.attr in SIGNAL_METHODS:
            if callback.value and _target_names(callback.value) & queues:
                return []
            return [f"{ast.unparse(callback)}: put to something not known as a queue.SimpleQueue"]
        if isinstance(callback, ast.Name):
            defs = [d for d in local.get(callback.id, []) if d.col_offset == 0]
        elif (
            isinstance(callback, ast.Attribute) and isinstance(callback.value, ast.Name) and callback.value.id == "self"
        ):
            defs = local.get(callback.attr, [])
        else:
            defs = []
        if not defs:
            return [f"cannot tell what {ast.unparse(callback)} does: make it a function of this module"]
        return [problem for definition in defs for problem in self._body(definition, queues, local, set())]

    def _body(self, function: ast.FunctionDef, queues, local, seen: set) -> list[str]:
        if id(function) in seen:
            return []
        seen.add(id(function))
        problems = []
        for statement in function.body:
            problems += self._statement(statement, queues, local, seen, function.name)
        return problems

    def _statement(self, statement, queues, local, seen, name) -> list[str]:
        if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant):
            return []  # a docstring
        if isinstance(statement, ast.Pass | ast.Return | ast.Assign | ast.AnnAssign | ast.AugAssign | ast.Expr):
            return self._calls(statement, queues, local, seen, name)
        if isinstance(statement, ast.If):
            problems = self._calls(statement.test, queues, local, seen, name)
            for inner in [*statement.body, *statement.orelse]:
                problems += self._statement(inner, queues, local, seen, name)
            return problems
        return [f"{name}: {type(statement).__name__.lower()} statement at line {statement.lineno}"]

    def _calls(self, node, queues, local, seen, name) -> list[str]:
        problems = []
        for call in (n for n in ast.walk(node) if isinstance(n, ast.Call)):
            func = call.func
            if isinstance(func, ast.Attribute) and func.attr in SIGNAL_METHODS and _target_names(func.value) & queues:
                continue
            called = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
            defs = self.tree_functions.get(called, []) if called else []
            if not defs or called in SIGNAL_METHODS:
                problems.append(f"{name}: calls {ast.unparse(func)} (line {call.lineno})")
                continue
            for definition in defs:  # every function of the tree by that name must only signal
                problems += [
                    f"{name}: {ast.unparse(func)}() -> {p}" for p in self._body(definition, queues, local, seen)
                ]
        return problems


def parse(path: pathlib.Path, root: pathlib.Path) -> Module:
    return Module(str(path.relative_to(root)), ast.parse(path.read_text(), str(path)))


def tree_modules() -> list[Module]:
    root = helpers.REPO_ROOT
    return [parse(path, root) for tree in TREES for path in sorted((root / tree).rglob("*.py"))]


def test_every_finalizer_in_the_tree_only_signals():
    found = Checker(tree_modules()).finalizers()
    assert "ProducedIterator.__del__" in {what for _, what, _ in found}, "a check that finds none checks nothing"
    bad = [f"{where} {what}: {'; '.join(problems[:3])}" for where, what, problems in found if problems]
    assert not bad, "finalizers that do more than signal:\n" + "\n".join(bad)


def check_snippet(source: str) -> list[str]:
    module = Module("snippet.py", ast.parse(textwrap.dedent(source)))
    return [problem for _, _, problems in Checker([module]).finalizers() for problem in problems]


def test_the_check_refuses_finalizers_that_close_lock_join_or_submit():
    assert check_snippet(
        """
        class Iterator:
            def close(self):
                self._pool.submit(self.ack)
            def __del__(self):
                self.close()
        """
    ), "a __del__ that submits, through a method"
    assert check_snippet(
        """
        import weakref
        def _close(lock, thread):
            with lock:
                thread.join()
        class Connection:
            def __init__(self):
                weakref.finalize(self, _close, self._lock, self._thread)
        """
    ), "a weakref.finalize callback that locks and joins"
    assert check_snippet(
        """
        import queue, weakref
        class Ring:
            def __init__(self):
                self._ended = queue.Queue()
                weakref.finalize(self, self._ended.put, 1)
        """
    ), "a put to a queue.Queue (which locks)"
    assert check_snippet(
        """
        import multiprocessing.util
        class Ring:
            def __init__(self):
                multiprocessing.util.Finalize(self, self._remove, exitpriority=0)
            def _remove(self):
                self._memory.unlink()
        """
    ), "a multiprocessing Finalize tied to an object"


def test_the_check_accepts_flags_and_simple_queues():
    assert not check_snippet(
        """
        import multiprocessing.util, queue, weakref
        _work = queue.SimpleQueue()
        def _signal(item):
            _work.put(item)
        class Producer:
            def stop_soon(self):
                self._stopped = True
        class Iterator:
            def __init__(self):
                self._dropped = queue.SimpleQueue()
                weakref.finalize(self, _signal, (print, ()))
                weakref.finalize(self, self._dropped.put, (1, 2))
                multiprocessing.util.Finalize(None, self._remove, exitpriority=0)
            def _remove(self):
                self._memory.unlink()
            def __del__(self):
                producer = self._producer
                if producer is not None:
                    producer.stop_soon()
        """
    )
