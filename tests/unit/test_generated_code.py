"""The gRPC modules in libs/trainyard/_pb are what `make proto` makes from proto/.

The test reads the protoc command and the import rewrite from the Makefile's
``proto`` target, runs them into a temporary directory and compares every
generated file with the committed one byte for byte, except the generator
version stamps (protoc and grpcio-tools write their own version into the
code; a newer grpcio-tools makes the same code with another stamp).
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PB_OUT = ROOT / "libs" / "trainyard" / "_pb"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")

# Version stamps the generators write; each number is replaced by a placeholder before comparing.
VERSION_LINES = [
    re.compile(r"^(# Protobuf Python Version: ).*$", re.M),
    re.compile(r"^(GRPC_GENERATED_VERSION = ).*$", re.M),
]
# _runtime_version.ValidateProtobufRuntimeVersion(Domain.PUBLIC, major, minor, patch, suffix, file)
RUNTIME_CHECK = re.compile(
    r"(ValidateProtobufRuntimeVersion\(\s*_runtime_version\.Domain\.PUBLIC,)(\s*\d+,\s*\d+,\s*\d+,\s*'[^']*',)"
)


def _proto_recipe() -> tuple[list[str], list[tuple[str, str]]]:
    """The protoc arguments and the sed substitutions of the Makefile's ``proto`` target."""
    makefile = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^proto:.*\n((?:\t.*\n)+)", makefile, re.M)
    assert recipe is not None, "the Makefile has no proto target"
    lines = [line.strip() for line in recipe.group(1).splitlines()]
    protoc = [line for line in lines if "grpc_tools.protoc" in line]
    assert len(protoc) == 1, f"expected one protoc command in the proto target, found {protoc}"
    args = shlex.split(protoc[0])
    assert args[:3] == ["$(PYTHON)", "-m", "grpc_tools.protoc"], args
    substitutions = [
        (m.group(1), m.group(2))
        for line in lines
        if line.startswith("sed ")
        for m in re.finditer(r"'s/((?:[^/\\]|\\.)*)/((?:[^/\\]|\\.)*)/'", line)
    ]
    return args[3:], substitutions


def _generate(out: Path) -> None:
    args, substitutions = _proto_recipe()
    expanded: list[str] = []
    for arg in args:
        arg = arg.replace("$(PB_OUT)", str(out))
        if "*" in arg:
            matches = sorted(ROOT.glob(arg))
            assert matches, f"{arg} matches no .proto file"
            expanded.extend(str(m.relative_to(ROOT)) for m in matches)
        else:
            expanded.append(arg)
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", *expanded], cwd=ROOT, check=True)
    for path in out.rglob("*_pb2*.py"):
        text = path.read_text()
        for pattern, replacement in substitutions:
            text = re.sub(pattern, replacement.replace("\\", ""), text, flags=re.M)
        path.write_text(text)


def _without_versions(text: str) -> str:
    for line in VERSION_LINES:
        text = line.sub(lambda m: m.group(1) + "<version>", text)
    return RUNTIME_CHECK.sub(lambda m: m.group(1) + re.sub(r"\d+|'[^']*'", "<version>", m.group(2)), text)


def _generated_files(base: Path) -> dict[str, Path]:
    return {str(p.relative_to(base)): p for p in base.rglob("*") if p.name.endswith(GENERATED_SUFFIXES)}


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("pb")
    _generate(out)
    return out


def test_make_proto_generates_the_committed_set_of_modules(fresh: Path) -> None:
    made, committed = _generated_files(fresh), _generated_files(PB_OUT)
    assert made, "protoc generated nothing"
    assert sorted(committed) == sorted(made), (
        "the committed gRPC modules are not the ones proto/ makes; run `make proto`"
    )


def test_each_committed_module_equals_what_make_proto_generates(fresh: Path) -> None:
    stale = [
        name
        for name, path in sorted(_generated_files(fresh).items())
        if (PB_OUT / name).exists()
        and _without_versions((PB_OUT / name).read_text()) != _without_versions(path.read_text())
    ]
    assert not stale, f"{stale} differ from what proto/ generates; run `make proto` and commit the result"


@pytest.mark.parametrize(
    ("module", "stamps"),
    [
        pytest.param("jobs_pb2.py", 5, id="protobuf module: the version comment and the runtime check's 4 parts"),
        pytest.param("jobs_pb2_grpc.py", 1, id="gRPC module: GRPC_GENERATED_VERSION"),
        pytest.param("jobs_pb2.pyi", 0, id="type stubs: no stamp"),
    ],
)
def test_only_the_version_stamps_are_masked(module: str, stamps: int) -> None:
    committed = (PB_OUT / "trainyard" / "v1" / module).read_text()
    masked = _without_versions(committed)
    assert masked.count("<version>") == stamps, "a version stamp moved; update VERSION_STAMPS"
    assert len(masked.splitlines()) == len(committed.splitlines())
