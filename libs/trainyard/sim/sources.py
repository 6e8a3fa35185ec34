"""Where each public trace file comes from, and ``trainyard traces fetch``.

The repository's ``traces/`` folder holds the files whose licences allow them to be
passed on (Philly and its VC sizes, the Helios summaries, Alibaba PAI 2020's machine
list, the published reference figures), with their licence files (traces/README.md).
The others stay where their authors publish them: the Lucid-derived Venus files are
under the S-Lab License 1.0 (non-commercial use only), and Alibaba PAI 2023's CSVs come
with no licence file at all.  :data:`SOURCES` pins every file that can be fetched,
committed ones included (an installed package has no ``traces/``), to a commit of its
upstream repository and to the SHA-256 of its bytes; :func:`fetch` downloads what is
missing and keeps a file only when its checksum matches.
"""

from __future__ import annotations

import hashlib
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, NamedTuple

#: Where GitHub serves a file of a repository at a commit; ``--mirror`` replaces it.
UPSTREAM = "https://raw.githubusercontent.com"
MAX_BYTES = 64 * 1024 * 1024  # no trace file here is near this: a larger answer is not the file
CHUNK = 1 << 16

ADAPTDL = "petuum/adaptdl/c793c7089bd307462686339d29707925c461f9a9"
HELIOS_ARTIFACT = "S-Lab-System-Group/HeliosArtifact/bdaae109c21f8038a2331e6a23a582d5ae78ab5b"
HELIOS_DATA = "S-Lab-System-Group/HeliosData/50b7631750b9b6a8079259cccf17bde7981ae315"
PHILLY_SCRIPTS = "Qinghao-Hu/Philly-Trace-Scripts/2d1478f0b4cd65eb2d80ca489ac2f284164b7441"
LUCID = "S-Lab-System-Group/Lucid/63685a3ab7d15d8e940bb47ef98b6d5cca472b13"
CLUSTERDATA = "alibaba/clusterdata/7a6c496e4f4b6ce6150be8f881cb051bf2abff42"

CC_BY = "CC BY 4.0"
S_LAB = "S-Lab License 1.0: non-commercial use only"
NO_LICENCE = "no licence file upstream: for your own study only, cite Weng et al., ATC'23"


class Source(NamedTuple):
    path: str  # inside the traces folder: <group>/<file>
    origin: str  # owner/repository/commit
    upstream: str  # the file's path in that repository
    sha256: str
    licence: str
    committed: bool  # in the repository's traces/ folder

    @property
    def group(self) -> str:
        return self.path.split("/", 1)[0]

    def url(self, base: str = UPSTREAM) -> str:
        return f"{base.rstrip('/')}/{self.origin}/{urllib.parse.quote(self.upstream)}"


def _alibaba_2023(name: str, sha256: str) -> Source:
    return Source(
        f"alibaba_pai_2023/{name}", CLUSTERDATA, f"cluster-trace-gpu-v2023/csv/{name}", sha256, NO_LICENCE, False
    )


SOURCES: tuple[Source, ...] = (
    Source(
        "philly/philly_jobs_adaptdl.csv",
        ADAPTDL,
        "simulator/traces/philly.csv",
        "ebffb3dd1589bdf4e7bcd74496201c5ded1d557d498ee14f560463f37ec353da",
        CC_BY,
        True,
    ),
    Source(
        "philly/philly_vc_nodes.csv",
        HELIOS_ARTIFACT,
        "framework/QSSF Service/data/philly_vc.csv",
        "a6873abd7d94a09c646961ad7a0f011faf4069dcdf0c1f7717521613fd6156f7",
        "MIT",
        True,
    ),
    Source(
        "philly/philly_cluster_machine_list.csv",
        PHILLY_SCRIPTS,
        "data/cluster_machine_list",
        "5a3f3ad190fcf75bb44b8f7e4b1a8d76897255e35657d3038c8e43d021cba22f",
        "MIT",
        True,
    ),
    Source(
        "philly/philly_machine_list_revised.csv",
        PHILLY_SCRIPTS,
        "data/revised_machine_list.csv",
        "8662346b8cc6d4c3d80e659ec8bcdc9b32b9badd69eda61f14c47f855a99898e",
        "MIT",
        True,
    ),
    Source(
        "helios/helios_cluster_summary.csv",
        HELIOS_ARTIFACT,
        "analysis/1_compare with Philly trace/helios_cluster_summary.csv",
        "9cfbef77bdcfab43e0ffbc886e9d8ca8ac0dd16528945c52d76693179a6122f6",
        "MIT",
        True,
    ),
    Source(
        "helios/venus_cluster_gpu_number.csv",
        HELIOS_DATA,
        "data/Venus/cluster_gpu_number.csv",
        "08c05fc4d2ac94aceb43f2bfd28d731a089df8e9bb7c3412d2bd211cab2ed57c",
        CC_BY,
        True,
    ),
    Source(
        "helios/venus_cluster_throughput_lucid.csv",
        LUCID,
        "simulation/data/Venus/cluster_throughput.csv",
        "69642494d5f3cb9dff382de90ce1b2fac6c53f63c765e0c3eed9741cb20d4674",
        S_LAB,
        False,
    ),
    Source(
        "helios/venus_vc_config_sept_lucid.csv",
        LUCID,
        "simulation/data/Venus/vc_config.csv",
        "e25f63eecc9d19e905f55c37dceddffcd3a797bf83895fc7efe63c8cde6ca524",
        S_LAB,
        False,
    ),
    Source(
        "helios/LICENSE-Lucid",
        LUCID,
        "LICENSE.txt",
        "7fd87dc54bee73480e7acd209f156ba0524de6d6c4d87841c1107aa9d53573d8",
        S_LAB,
        False,
    ),
    _alibaba_2023("openb_pod_list_default.csv", "1ee7ed79c27a3b0861cda8ddba86a004c6aba904caafa329a76ae93ca63834a8"),
    _alibaba_2023("openb_pod_list_gpuspec33.csv", "eca4f746db1e5b25864ad021b55ece3943e101a3ebd4574d09dcb95c46117652"),
    _alibaba_2023("openb_pod_list_multigpu50.csv", "206f2f5959db30ecb7c44e7f13197c8ec50b7a35558ad3777cc3662ef0fe5373"),
    _alibaba_2023("openb_node_list_gpu_node.csv", "2beca64b4d3dfa342036a34b56a495c6cef9225db836c81f541282cb1df320b5"),
    _alibaba_2023("openb_node_list_all_node.csv", "5a85c2af79c66a1efff8bbcbda430400aae56d8431370d738480967e1a9c6b15"),
    Source(
        "alibaba_pai_2023/README-clusterdata.md",
        CLUSTERDATA,
        "cluster-trace-gpu-v2023/README.md",
        "4445ce29c045d3281f857f25c392b78880658978ea4fc420ec3f5b4bf621bc80",
        NO_LICENCE,
        False,
    ),
)
GROUPS = tuple(dict.fromkeys(s.group for s in SOURCES))

Opener = Callable[[str], Any]  # urllib.request.urlopen's shape: a context manager with read(n)
TIMEOUT_S = 60.0


class FetchError(ValueError):
    """A file could not be fetched whole and as pinned; nothing was written for it."""


class MissingTraces(ValueError):
    """A trace file the simulator needs is not in the traces folder."""


def fetch_hint(folder: Path, group: str) -> str:
    return (
        f"run `trainyard traces fetch --only {group} --dest {folder}`, or point --traces (or TRAINYARD_TRACES) "
        f"at a folder holding {group}/ (docs/traces.md)"
    )


def require(folder: Path, group: str, names: Iterable[str]) -> None:
    """Raise :class:`MissingTraces` with the fetch command when any of ``names`` is not in ``folder/group``."""
    missing = [name for name in names if not (folder / group / name).is_file()]
    if missing:
        raise MissingTraces(f"{folder / group}: {', '.join(missing)} not found; {fetch_hint(folder, group)}")


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def selected(only: Iterable[str] = ()) -> list[Source]:
    """The sources of the groups named in ``only`` (all when empty); an unknown group raises ``FetchError``."""
    wanted = list(only)
    unknown = [g for g in wanted if g not in GROUPS]
    if unknown:
        raise FetchError(f"--only: unknown trace folder {', '.join(unknown)}; choose from {', '.join(GROUPS)}")
    return [s for s in SOURCES if not wanted or s.group in wanted]


def fetch(
    dest: Path,
    sources: Iterable[Source],
    base: str = UPSTREAM,
    opener: Opener | None = None,
    progress: Callable[[str], None] = lambda line: None,
) -> dict[str, str]:
    """Download every source missing from ``dest`` (or there with other bytes) and keep it
    only if its SHA-256 is the pinned one; returns path -> "kept" or "fetched".  A file
    that fails (unreachable, too large, another checksum) raises ``FetchError`` naming it,
    and leaves nothing of itself behind; the files fetched before it stay."""
    outcome: dict[str, str] = {}
    for source in sources:
        target = dest / source.path
        if target.is_file() and sha256_of(target) == source.sha256:
            outcome[source.path] = "kept"
            continue
        url = source.url(base)
        progress(f"{source.path} <- {url}  ({source.licence})")
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.partial")
        try:
            got = _download(url, partial, opener or _open)
            if got != source.sha256:
                raise FetchError(f"{source.path}: {url} has SHA-256 {got}, not the pinned {source.sha256}; not kept")
            os.replace(partial, target)
        finally:
            partial.unlink(missing_ok=True)
        outcome[source.path] = "fetched"
    return outcome


def _open(url: str) -> Any:
    return urllib.request.urlopen(url, timeout=TIMEOUT_S)


def _download(url: str, into: Path, opener: Opener) -> str:
    digest, size = hashlib.sha256(), 0
    try:
        with opener(url) as answer, open(into, "wb") as out:
            while chunk := answer.read(CHUNK):
                size += len(chunk)
                if size > MAX_BYTES:
                    raise FetchError(f"{url}: larger than {MAX_BYTES // (1024 * 1024)} MiB; not a trace file here")
                digest.update(chunk)
                out.write(chunk)
    except urllib.error.HTTPError as e:
        raise FetchError(f"{url}: HTTP {e.code} {e.reason}") from e
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", None) or e
        raise FetchError(f"{url}: cannot be read ({reason})") from e
    return digest.hexdigest()
