"""scripts/gpu/: which wheels travel to a bare GPU machine, and the JSON its run writes. The run
itself (``run.sh --cpu``) is a step of CI of its own; these check the parts it is made of."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

GPU_SCRIPTS = Path(__file__).resolve().parents[1] / "scripts" / "gpu"


def _module(name: str):
    spec = importlib.util.spec_from_file_location(f"gpu_{name}", GPU_SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


wheels = _module("wheels")


def test_the_wheels_are_what_the_machine_lacks_at_the_versions_installed_here():
    present = wheels.machine_packages(GPU_SCRIPTS / "machine-packages.txt")
    relied_on: dict[str, str] = {}
    needed = wheels.needed("chunkstore", present, "3.12", relied_on)
    assert {"zstandard", "sqlalchemy", "alembic", "pydantic", "pydantic-core", "fastapi", "uvicorn",
            "cryptography"} <= set(needed)
    # The machine has these; what only they need (tokenizers, for transformers) is not walked into.
    assert not {"torch", "numpy", "transformers", "xxhash", "tokenizers", "huggingface-hub"} & set(needed)
    assert "typing-extensions" in present and "typing-extensions" in needed  # carried all the same
    # What the carried wheels and chunkstore require of the machine's packages, for its check there.
    assert relied_on["numpy"] == ">=1.24" and relied_on["torch"] == ">=2.4" and "anyio" in relied_on
    from importlib.metadata import version
    assert all(version(name) == v for name, v in needed.items())


def test_on_a_machine_with_nothing_every_requirement_travels():
    needed = wheels.needed("chunkstore", set(), "3.12")
    assert {"torch", "numpy", "transformers", "tokenizers"} <= set(needed)


def _report(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(GPU_SCRIPTS / "report.py"), *args], capture_output=True, text=True)


def test_the_tests_outcome_comes_from_pytests_own_junit_file(tmp_path):
    (tmp_path / "test_some.py").write_text(
        "import pytest\n"
        "def test_ok(): pass\n"
        "def test_bad(): assert 1 == 2, 'off by one'\n"
        "@pytest.mark.skip(reason='needs a CUDA device')\n"
        "def test_skipped(): pass\n")
    junit = tmp_path / "tests.xml"
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--junitxml", str(junit),
                    str(tmp_path / "test_some.py")], cwd=tmp_path, capture_output=True)
    again = tmp_path / "again.xml"
    again.write_bytes(junit.read_bytes())
    assert _report("tests", str(tmp_path / "tests.json"), str(junit)).returncode == 0
    result = json.loads((tmp_path / "tests.json").read_text())
    assert (result["passed"], result["failed"], result["errors"], result["skipped"]) == (1, 1, 0, 1)
    assert {c["test"].split("::")[-1]: c["outcome"] for c in result["not_passed"]} == {
        "test_bad": "failed", "test_skipped": "skipped"}
    assert result["runs_without_report"] == [] and not junit.exists()
    # Two runs add up; one killed before the end of its session wrote no file: named, and exit 1.
    assert _report("tests", str(tmp_path / "tests.json"), str(again), str(tmp_path / "killed.xml")).returncode == 1
    result = json.loads((tmp_path / "tests.json").read_text())
    assert result["passed"] == 1 and result["runs_without_report"] == ["killed.xml"]



def test_the_summary_computes_the_gpu_targets_and_names_a_missing_figure(tmp_path):
    steps = tmp_path / "steps"
    steps.write_text("tiers 0 12 60\nstore 124 60 60\n")
    (tmp_path / "tiers.json").write_text(json.dumps({"host_to_device_vs_memcpy": 0.93}))
    assert _report("summary", str(tmp_path), str(steps)).returncode == 0  # without --check: a report only
    checked = _report("summary", str(tmp_path), str(steps), "--check")
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["targets"]["host_to_device_vs_memcpy"] == {"value": 0.93, "target": ">= 0.8", "pass": True}
    assert summary["targets"]["disk_throughput_vs_device_host"]["pass"] is None  # multiturn never ran
    assert summary["steps"]["store"]["timed_out"]
    assert checked.returncode == 1
    assert "store exited 124 (out of time)" in checked.stderr
    assert "tiers.json has no disk_to_device_vs_load" in checked.stderr


@pytest.mark.parametrize("args, message", [
    (["--bogus"], "unknown option --bogus"),
    (["--budget-s", "soon"], "--budget-s takes whole seconds"),
])
def test_run_refuses_bad_options(args, message):
    result = subprocess.run([str(GPU_SCRIPTS / "run.sh"), *args], capture_output=True, text=True)
    assert result.returncode == 2 and message in result.stderr
