"""The import rules of docs/architecture.md, checked on the source: every module imports only from its
own layer or below, a job uses only the jobs its row of JOB_USES names, and no import cycle exists anywhere in
src/gym, between modules or between packages. Also: `import gym` and reading a config stay light.

Each failure prints the offending edge (importer -> imported, with the line), so the fix is obvious.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"

# Bottom to top. A module belongs to the layer of its longest matching prefix.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("core", ("gym.core",)),
    ("config", ("gym.config",)),
    ("building blocks", ("gym.data", "gym.models", "gym.rewards", "gym.safety")),
    ("infer", ("gym.infer",)),
    ("jobs", ("gym.train", "gym.delta", "gym.soup", "gym.personalization", "gym.tfgrpo", "gym.eval",
              "gym.export", "gym.merge", "gym.service")),
    ("workflows", ("gym.workflows", "gym.tune")),
    ("doors", ("gym", "gym.cli", "gym.python_api", "gym.hparams", "gym.quantization", "gym.serve", "gym.webui")),
]

# Package modules that are doors of their own, whatever their package: `from gym.train import run_sft` is
# LLaMA-Factory's spelling of the workflow layer's entry points (gym/train/__init__.py re-exports them lazily).
FACADES = {"gym.train": "doors"}

# Within the jobs layer, the jobs each job may use (every other job-to-job import is an error): deltas are the
# artefact the variant and soup jobs are made of; a variant is trained by the training job; export and eval take a
# variant (STORE:USER) or a delta as their model. The training job uses none: what follows training (compress,
# evaluate) is composed in gym.workflows.
JOB_USES: dict[str, set[str]] = {
    "gym.train": set(),
    "gym.delta": set(),
    "gym.tfgrpo": set(),
    "gym.merge": {"gym.delta"},
    "gym.soup": {"gym.delta"},
    "gym.personalization": {"gym.delta", "gym.train"},
    "gym.export": {"gym.delta", "gym.personalization"},
    "gym.eval": {"gym.delta", "gym.personalization"},
    # The service (keys, files, jobs) names users as variant stores do and runs the same training job as `gym train`.
    "gym.service": {"gym.personalization", "gym.train"},
}

def layer_of(module: str) -> int:
    if module in FACADES:
        return [name for name, _ in LAYERS].index(FACADES[module])
    best, level = -1, -1
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, level = len(prefix), index
    if level < 0:
        raise AssertionError(f"{module} is in no layer: add its package to LAYERS and to docs/architecture.md")
    return level


@dataclass(frozen=True)
class Edge:
    importer: str
    imported: str
    line: int
    type_only: bool  # under `if TYPE_CHECKING:`: checked for layering, not for cycles (it never runs)

    def __str__(self) -> str:
        kind = " (type-only)" if self.type_only else ""
        return (f"{self.importer} ({LAYERS[layer_of(self.importer)][0]}) -> {self.imported} "
                f"({LAYERS[layer_of(self.imported)][0]}), line {self.line}{kind}")


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST, type_only: bool = False) -> Iterator[tuple[ast.stmt, bool]]:
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node, type_only
        elif isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.body:
                yield from _imports(ast.Module(body=[child], type_ignores=[]), True)
            for child in node.orelse:
                yield from _imports(ast.Module(body=[child], type_ignores=[]), type_only)
        else:
            yield from _imports(node, type_only)  # imports inside functions and classes run too


def edges_of(module: str, source: str, known: set[str]) -> list[Edge]:
    """Every import of a gym module in `source`, resolved to the module it loads."""
    package = module if f"{module}.__init__" in known else module.rsplit(".", 1)[0]
    found = []
    for node, type_only in _imports(ast.parse(source)):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative import
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            # `from gym.x import y` loads gym.x.y when y is a module, else gym.x.
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        for target in targets:
            if target == "gym" or target.startswith("gym."):
                found.append(Edge(module, target, node.lineno, type_only))
    return found


def source_modules(root: Path = SRC) -> dict[str, str]:
    return {module_name(p, root): p.read_text(encoding="utf-8") for p in sorted((root / "gym").rglob("*.py"))}


def all_edges(modules: dict[str, str]) -> list[Edge]:
    known = set(modules) | {f"{m}.__init__" for m in modules if (SRC / Path(*m.split("."), "__init__.py")).is_file()}
    return [edge for module, source in modules.items() for edge in edges_of(module, source, known)
            if edge.imported != module]


def upward(edges: list[Edge]) -> list[Edge]:
    return [e for e in edges if layer_of(e.imported) > layer_of(e.importer)]


def package_of(module: str) -> str:
    """gym.delta.apply -> gym.delta; a facade is a node of its own (it is a door, not its package)."""
    if module in FACADES:
        return f"{module} (facade)"
    return ".".join(module.split(".")[:2])


def package_edges(edges: list[Edge]) -> list[Edge]:
    """The module edges as edges between packages (gym.x), one per module edge that crosses packages."""
    return [Edge(package_of(e.importer), package_of(e.imported), e.line, e.type_only) for e in edges
            if package_of(e.importer) != package_of(e.imported)]


def job_edges_not_allowed(edges: list[Edge]) -> list[Edge]:
    jobs = [e for e in edges if package_of(e.importer) in JOB_USES and package_of(e.imported) in JOB_USES]
    return [e for e in jobs if package_of(e.importer) != package_of(e.imported)
            and package_of(e.imported) not in JOB_USES[package_of(e.importer)]]


def cycles(edges: list[Edge]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each a cycle to break."""
    graph: dict[str, set[str]] = {}
    for e in edges:
        if not e.type_only:
            graph.setdefault(e.importer, set()).add(e.imported)
            graph.setdefault(e.imported, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph[node]):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


def test_no_module_imports_from_a_higher_layer():
    bad = upward(all_edges(source_modules()))
    assert not bad, "Upward imports (a layer may import only from itself and below):\n" + "\n".join(map(str, bad))


def test_no_import_cycles():
    edges = all_edges(source_modules())
    found = cycles(edges)
    detail = []
    for component in found:
        members = set(component)
        detail += [f"  {e}" for e in edges if e.importer in members and e.imported in members and not e.type_only]
    assert not found, "Import cycles:\n" + "\n".join(detail)


def test_no_import_cycles_between_packages():
    edges = package_edges(all_edges(source_modules()))
    found = cycles(edges)
    detail = [f"  {e.importer} -> {e.imported}" for e in edges if any(
        e.importer in c and e.imported in c for c in found) and not e.type_only]
    assert not found, "Import cycles between packages:\n" + "\n".join(sorted(set(detail)))


def test_each_job_uses_only_the_jobs_it_is_allowed():
    edges = all_edges(source_modules())
    assert set(JOB_USES) == set(LAYERS[[n for n, _ in LAYERS].index("jobs")][1]), "every job has a JOB_USES row"
    bad = job_edges_not_allowed(edges)
    assert not bad, "Imports between jobs that JOB_USES does not allow:\n" + "\n".join(map(str, bad))


def test_the_checker_catches_a_deliberate_package_cycle():
    """Two modules that are no cycle themselves still make a cycle between their packages."""
    modules = source_modules()
    modules["gym.delta.format"] += "\nfrom gym.soup.config import AggregationMethod\n"
    found = cycles(package_edges(all_edges(modules)))
    assert ["gym.delta", "gym.soup"] in found
    assert not cycles(all_edges(modules)), "the injected edge is no module-level cycle: only the package check sees it"


def test_the_checker_catches_a_job_using_a_job_it_may_not():
    modules = source_modules()
    modules["gym.train.run"] += "\n\ndef _late():\n    from gym.eval.runner import run_eval\n"
    assert [str(e) for e in job_edges_not_allowed(all_edges(modules))] == [
        "gym.train.run (jobs) -> gym.eval.runner (jobs), line 0"] or any(
        e.importer == "gym.train.run" and e.imported == "gym.eval.runner" for e in job_edges_not_allowed(
            all_edges(modules)))


def test_reading_a_config_loads_neither_torch_nor_the_training_job():
    """Every stage's config parses (its options included) without torch, transformers, TRL or gym.train."""
    code = ("import sys\n"
            "from gym.config.parser import get_train_args\n"
            "from gym.config.stages.registry import registered_stages\n"
            "for name, stage in registered_stages().items():\n"
            "    online = {'reward_funcs': ['accuracy']} if stage.data_kind.value == 'prompt' else {}\n"
            "    get_train_args({'stage': name, 'per_device_train_batch_size': 4, **online})\n"
            "heavy = ('torch', 'transformers', 'trl', 'peft', 'datasets')\n"
            "print(sorted(m for m in sys.modules if m in heavy or m.startswith('gym.train')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize(("importer", "line", "expected"), [
    ("gym.core.errors", "from gym.train.run import run_training", "gym.core.errors (core) -> gym.train.run (jobs)"),
    ("gym.config.parser", "import gym.infer.chat", "gym.config.parser (config) -> gym.infer.chat (infer)"),
    ("gym.data.loader", "    from gym.serve.app import create_app", "gym.data.loader (building blocks) -> "
                                                                       "gym.serve.app (doors)"),
])
def test_the_checker_catches_a_deliberate_upward_import(importer, line, expected):
    modules = source_modules()
    source = modules[importer] + ("\n\ndef _late():\n" + line + "\n" if line.startswith(" ") else "\n" + line + "\n")
    modules[importer] = source
    assert any(str(e).startswith(expected) for e in upward(all_edges(modules)))


def test_the_checker_catches_a_deliberate_cycle():
    modules = source_modules()
    modules["gym.core.names"] += "\nfrom gym.core import kinds\n"
    modules["gym.core.kinds"] += "\nfrom gym.core.names import split_names\n"
    assert ["gym.core.kinds", "gym.core.names"] in cycles(all_edges(modules))


def test_type_only_imports_do_not_make_cycles_but_still_count_for_layers():
    modules = source_modules()
    modules["gym.core.kinds"] += ("\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                  "    from gym.config.args import TrainArgs\n")
    edges = all_edges(modules)
    assert any(e.type_only and e.imported == "gym.config.args" for e in upward(edges))


def test_import_gym_loads_neither_torch_nor_transformers():
    heavy = "('torch', 'transformers', 'datasets', 'peft')"
    code = f"import sys, gym; print(sorted(m for m in {heavy} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_gym_help_loads_neither_torch_nor_transformers():
    code = ("import sys; from gym.cli import main; main(['--help']); "
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"


def test_no_module_is_over_600_lines():
    """A guard against sprawl, not a target: split a module where its concept ends, never to get under a count."""
    long = {m: n for m, s in source_modules().items() if (n := len(s.splitlines())) > 600}
    assert not long, f"split these by concern: {long}"
