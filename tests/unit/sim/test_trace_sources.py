"""The repository's traces and ``trainyard traces fetch``: every pinned file that is
committed has its pinned bytes, and fetching from a local HTTP server (a mirror with
GitHub's paths; nothing is fetched from the internet here) keeps a file only when its
SHA-256 is the pinned one.  Without the Philly trace, ``sim compare`` says how to get it."""

from __future__ import annotations

import hashlib
import shutil
import threading
from collections.abc import Iterator
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from typer.testing import CliRunner

from trainyard.cli.main import app
from trainyard.sim import load_philly
from trainyard.sim.sources import GROUPS, SOURCES, FetchError, MissingTraces, Source, fetch, selected, sha256_of
from trainyard.sim.workloads import REPOSITORY_TRACES, traces_dir

ROOT = Path(__file__).resolve().parents[3]
PHILLY = [s for s in SOURCES if s.group == "philly"]


class Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def mirror(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A local file server and the folder it serves, laid out as raw.githubusercontent.com."""
    root = tmp_path / "mirror"
    root.mkdir()
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(Quiet, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", root
    finally:
        server.shutdown()
        server.server_close()


def publish(root: Path, source: Source, data: bytes) -> None:
    """Put ``data`` where the mirror serves ``source``."""
    path = root / source.origin / source.upstream
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def test_the_repository_holds_its_traces_and_the_default_points_there(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRAINYARD_TRACES", raising=False)
    assert traces_dir() == REPOSITORY_TRACES == ROOT / "traces"
    committed = [s for s in SOURCES if s.committed]
    assert {s.group for s in committed} == {"philly", "helios"}
    for source in committed:
        assert sha256_of(ROOT / "traces" / source.path) == source.sha256, source.path
    for source in SOURCES:
        if not source.committed:  # licences that do not allow passing them on: fetched, never committed
            assert not (ROOT / "traces" / source.path).exists(), source.path
    for group in ("philly", "helios", "alibaba_pai_2020", "reference"):
        assert list((ROOT / "traces" / group).glob("LICENSE*")), f"traces/{group} has no licence file"
    assert len(load_philly(limit=10).jobs) == 10


def test_the_upstream_urls_pin_a_full_commit_and_quote_spaces() -> None:
    [vc] = [s for s in SOURCES if s.path == "philly/philly_vc_nodes.csv"]
    assert vc.url() == (
        "https://raw.githubusercontent.com/S-Lab-System-Group/HeliosArtifact/"
        "bdaae109c21f8038a2331e6a23a582d5ae78ab5b/framework/QSSF%20Service/data/philly_vc.csv"
    )
    for source in SOURCES:
        assert len(source.origin.rsplit("/", 1)[1]) == 40 and len(source.sha256) == 64, source.path
    assert len({s.path for s in SOURCES}) == len(SOURCES)


def test_fetch_downloads_what_is_missing_checks_it_and_the_simulator_reads_it(mirror, tmp_path: Path) -> None:
    base, root = mirror
    for source in PHILLY:
        publish(root, source, (ROOT / "traces" / source.path).read_bytes())
    dest = tmp_path / "traces"
    with pytest.raises(MissingTraces, match="trainyard traces fetch --only philly"):
        load_philly(dest)
    assert fetch(dest, selected(["philly"]), base=base) == {s.path: "fetched" for s in PHILLY}
    for source in PHILLY:
        assert (dest / source.path).read_bytes() == (ROOT / "traces" / source.path).read_bytes()
    assert len(load_philly(dest).jobs) == len(load_philly().jobs)
    shutil.rmtree(root)  # a second fetch asks for nothing: every file is there and intact
    assert fetch(dest, selected(["philly"]), base=base) == {s.path: "kept" for s in PHILLY}
    assert sorted(p.name for p in (dest / "philly").iterdir()) == sorted(Path(s.path).name for s in PHILLY)


def test_a_file_with_other_bytes_is_refused_and_leaves_nothing(mirror, tmp_path: Path) -> None:
    base, root = mirror
    good = b"vc,node num\nA,2\n"
    pinned = Source("made/good.csv", "o/r/" + "a" * 40, "dir with space/good.csv", "", "MIT", False)
    pinned = pinned._replace(sha256=hashlib.sha256(good).hexdigest())
    tampered = pinned._replace(path="made/tampered.csv", upstream="tampered.csv")
    publish(root, pinned, good)
    publish(root, tampered, good + b"B,9\n")
    dest = tmp_path / "traces"
    with pytest.raises(FetchError, match=r"made/tampered.csv: .* has SHA-256 [0-9a-f]{64}, not the pinned"):
        fetch(dest, [pinned, tampered], base=base)
    assert sorted(p.name for p in (dest / "made").iterdir()) == ["good.csv"]  # the good one stays, no partial file
    (dest / "made" / "good.csv").write_bytes(b"changed locally")
    assert fetch(dest, [pinned], base=base) == {"made/good.csv": "fetched"}  # a changed file is fetched again
    assert (dest / "made" / "good.csv").read_bytes() == good
    absent = pinned._replace(path="made/absent.csv", upstream="absent.csv")
    with pytest.raises(FetchError, match=r"absent.csv: HTTP 404"):
        fetch(dest, [absent], base=base)
    assert not (dest / "made" / "absent.csv").exists()


def test_the_fetch_command_fetches_only_the_folders_named(mirror, tmp_path: Path) -> None:
    base, root = mirror
    for source in PHILLY:
        publish(root, source, (ROOT / "traces" / source.path).read_bytes())
    dest = tmp_path / "traces"
    args = ["traces", "fetch", "--only", "philly", "--dest", str(dest), "--mirror", base]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert f"{len(PHILLY)} fetched, 0 already there" in result.output
    assert sorted(p.name for p in dest.iterdir()) == ["philly"]
    again = CliRunner().invoke(app, args)
    assert f"0 fetched, {len(PHILLY)} already there and intact" in again.output
    wrong = CliRunner().invoke(app, ["traces", "fetch", "--only", "filly", "--dest", str(dest), "--mirror", base])
    assert wrong.exit_code == 2 and "unknown trace folder filly; choose from " + ", ".join(GROUPS) in wrong.output


def test_without_the_philly_trace_sim_compare_says_how_to_fetch_it(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    args = ["sim", "compare", "--workload", "philly", "--traces", str(empty), "--policies", "fifo"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    text = " ".join(result.output.split())
    assert f"run `trainyard traces fetch --only philly --dest {empty}`" in text
    assert "Errno" not in text
