"""The package's shape: stages in layers whose imports only point down, no import circle, and the
results layout spelled in one module."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "pipeline" / "meml"
# bottom to top, one folder of pipeline/meml/ each; a module may import its own layer and the ones
# before it. The planner (the grid, its layout and cost) sits above training and below evaluation;
# the jobs (the glue the CLI calls with a config) above every stage; the package's top-level modules
# (the CLI, the worker) last.
LAYERS = ["core", "data", "training", "plan", "evaluation", "reporting", "jobs", "top"]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(module: str) -> str:
    """A module's folder below meml/, or "top" for a module of meml/ itself."""
    parts = module.split(".")
    return parts[1] if len(parts) >= 3 or (PACKAGE / parts[-1]).is_dir() else "top"


def imports(path: Path) -> set[str]:
    """Every meml module this file imports, at the top or inside a function."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: relative import (the layers are checked on absolute names)"
            if node.module and node.module.split(".")[0] == "meml":
                found.add(node.module)
                # `from meml.training import checkpoint` imports a module, not a name
                found.update(
                    f"{node.module}.{a.name}"
                    for a in node.names
                    if (PACKAGE.parent / node.module.replace(".", "/") / f"{a.name}.py").is_file()
                )
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "meml")
    return found


def graph() -> dict[str, set[str]]:
    return {module_name(p): imports(p) for p in sorted(PACKAGE.rglob("*.py"))}


def test_imports_only_point_down() -> None:
    wrong = [
        f"{importer} ({layer(importer)}) imports {target} ({layer(target)})"
        for importer, targets in graph().items()
        for target in targets
        if LAYERS.index(layer(target)) > LAYERS.index(layer(importer))
    ]
    assert not wrong, "\n".join(wrong)


def test_every_folder_is_a_layer() -> None:
    folders = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert folders == set(LAYERS) - {"top"}, "a package folder that is not a layer, or a layer without a folder"
    assert {layer(module_name(p)) for p in PACKAGE.glob("*.py")} == {"top"}


def test_the_layer_check_sees_an_upward_import(tmp_path: Path) -> None:
    """An import that points up is found: a module of training that asks the planner."""
    upward = tmp_path / "upward.py"
    upward.write_text("from meml.plan.grid import cells\nfrom meml.core import io\n")
    targets = imports(upward)
    assert targets == {"meml.plan.grid", "meml.core", "meml.core.io"}
    wrong = [t for t in targets if LAYERS.index(layer(t)) > LAYERS.index(layer("meml.training.rl"))]
    assert wrong == ["meml.plan.grid"]
    assert layer("meml.cli") == "top" and layer("meml.jobs.training") == "jobs"
    assert layer("meml.data.toy.world") == "data"


def test_no_import_circle() -> None:
    edges = {m: {t for t in ts if t != m and not m.startswith(t + ".")} for m, ts in graph().items()}
    state: dict[str, int] = {}  # 1 on the path, 2 done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges.get(node, ())):
            if nxt not in edges:
                continue  # a package's __init__ or a name, not a module of ours
            assert state.get(nxt) != 1, "import circle: " + " -> ".join([*path, node, nxt])
            if nxt not in state:
                visit(nxt, [*path, node])
        state[node] = 2

    for module in sorted(edges):
        if module not in state:
            visit(module, [])


def test_results_paths_live_in_the_layout_module() -> None:
    """No "results/..." string in code outside plan/layout.py (docstrings and help texts may
    describe the layout; they do not decide it)."""
    literal = re.compile(r"^results/|/results/")
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "layout.py":
            continue
        tree = ast.parse(path.read_text())
        docs = {
            id(n.body[0].value)
            for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef)) and n.body and isinstance(n.body[0], ast.Expr)
        }
        helps = {id(k.value) for n in ast.walk(tree) if isinstance(n, ast.Call) for k in n.keywords if k.arg == "help"}
        for node in ast.walk(tree):
            plain = isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs | helps
            if plain and literal.search(node.value):
                offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {node.value!r}")
    assert not offenders, "\n".join(offenders)


def test_the_rules_take_result_paths_from_the_layout() -> None:
    """The Snakefile and the rule files build no path inside results/ themselves: they ask
    plan/layout.py (LAYOUT, with wildcards for names), outside comments."""
    rules = [PACKAGE.parents[1] / "Snakefile", *sorted((PACKAGE.parent / "rules").glob("*.smk"))]
    spelled = re.compile(r"""["'/]results/|\{RESULTS\}|^RESULTS\s*=""")
    offenders = [
        f"{path.name}:{number}: {line.strip()}"
        for path in rules
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if spelled.search(line.split("#", 1)[0])
    ]
    assert not offenders, "\n".join(offenders)
    assert spelled.search('out=f"{RESULTS}/toy"') and spelled.search("x = 'results/toy'")


def test_the_rl_loop_takes_its_run_in_three_types() -> None:
    """run_rl(args, paths, tracking): what the run is, where it reads and writes, where it reports;
    besides those, only a rollout engine to use instead of the configured one, and the progress bar."""
    import inspect
    import typing

    from meml.core.tracking import RunTracking
    from meml.training.rl import RLArgs, RLPaths, run_rl

    assert list(inspect.signature(run_rl).parameters) == ["args", "paths", "tracking", "engine", "progress"]
    hints = typing.get_type_hints(run_rl)
    assert hints["args"] is RLArgs and hints["paths"] is RLPaths
    assert hints["tracking"] == RunTracking | None


def test_the_planner_loads_without_torch() -> None:
    """The Snakefile imports the planner on every invocation: it asks the RL settings through
    core/config, never through the training modules that load torch (a second or more each time)."""
    import subprocess
    import sys

    modules = "meml.plan.grid, meml.plan.cost, meml.plan.targets, meml.plan.checks, meml.lifecycle"
    code = f"import sys, {modules}; assert 'torch' not in sys.modules"
    done = subprocess.run([sys.executable, "-c", code], env={"PYTHONPATH": str(PACKAGE.parent)}, timeout=120)
    assert done.returncode == 0
