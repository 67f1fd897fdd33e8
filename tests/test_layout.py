"""The repository's shape: each plugin a real distribution, the kernel independent of all of them."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PLUGIN_PROJECTS = sorted(p.parent for p in REPO.glob("plugins/*/*/pyproject.toml"))


def test_there_are_plugin_projects():
    assert PLUGIN_PROJECTS


def test_each_plugin_is_a_distribution_with_entry_point_package_and_tests():
    # the editable paths, as whole entries: "plugins/parsers/tools" must not match "plugins/parsers/tools-code"
    dev_requirements = {
        line.split()[1].split("[")[0]
        for line in (REPO / "requirements-dev.txt").read_text().splitlines()
        if line.startswith("-e ")
    }
    for project_dir in PLUGIN_PROJECTS:
        relative = project_dir.relative_to(REPO).as_posix()
        project = tomllib.loads((project_dir / "pyproject.toml").read_text())["project"]
        entry_points = project["entry-points"]["llmp"]
        assert entry_points, relative
        for reference in entry_points.values():
            package = reference.split(":")[0].split(".")[0]
            assert package.startswith("llmp_") and (project_dir / package / "__init__.py").exists(), relative
        assert any(project["dependencies"][i].startswith("llmp") for i in range(len(project["dependencies"])))
        assert list((project_dir / "tests").glob("test_*.py")), f"{relative} has no tests/"
        assert relative in dev_requirements, f"{relative} is missing from requirements-dev.txt"


def test_the_kernel_imports_no_plugin():
    plugin_packages = {
        ref.split(":")[0].split(".")[0]
        for d in PLUGIN_PROJECTS
        for ref in tomllib.loads((d / "pyproject.toml").read_text())["project"]["entry-points"]["llmp"].values()
    }
    for source in (REPO / "core").rglob("*.py"):
        imported = set(re.findall(r"^\s*(?:from|import)\s+(llmp_\w+)", source.read_text(), flags=re.MULTILINE))
        assert not imported & plugin_packages, f"{source} imports {imported & plugin_packages}"
