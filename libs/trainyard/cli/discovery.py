"""Where the command line finds the stack, from any directory.

In order, the first that answers wins:

1. ``--api-url`` / ``--data-dir`` on the command line;
2. the environment: ``TRAINYARD_API_URL``, ``TRAINYARD_DATA_DIR``;
3. a ``.trainyard`` data directory of a running ``trainyard up`` in the
   current directory or any directory above it;
4. the per-user config ``~/.config/trainyard/config.toml``, which
   ``trainyard up`` writes with its stack's URL and data directory;
5. ``http://127.0.0.1:8080``.

Only the standard library is imported here: every command that talks to the
gateway passes through this module, and it must answer in milliseconds."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

DEFAULT_DATA_DIR = ".trainyard"
DEFAULT_API_URL = "http://127.0.0.1:8080"
STATE_FILE = "state.json"  # written by a running `trainyard up` (trainyard.local.state)


def user_config_path() -> Path:
    """``~/.config/trainyard/config.toml``."""
    return Path.home() / ".config" / "trainyard" / "config.toml"


def read_user_config() -> dict[str, str]:
    """The ``[stack]`` table of the per-user config; {} when there is none or it cannot be read."""
    try:
        stack = tomllib.loads(user_config_path().read_text(encoding="utf-8")).get("stack", {})
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in stack.items() if isinstance(v, str)} if isinstance(stack, dict) else {}


def remember_stack(api_url: str, data_dir: str | Path) -> Path:
    """Write the per-user config naming this stack (``trainyard up`` does, once it is up)."""
    path = user_config_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    text = (
        "# Written by `trainyard up`: the stack the trainyard command uses from any directory\n"
        "# (after --api-url/--data-dir, TRAINYARD_API_URL/TRAINYARD_DATA_DIR and a .trainyard above it).\n"
        "[stack]\n"
        f"api_url = {json.dumps(api_url)}\n"
        f"data_dir = {json.dumps(str(Path(data_dir).resolve()))}\n"
    )
    path.write_text(text, encoding="utf-8")
    return path


def default_export_dir(data_dir: str | None) -> Path:
    """Where ``trainyard export`` writes when told nowhere: ``exports`` in the
    stack's data directory (as :func:`find_data_dir` finds it) when there is
    one, else ``~/.local/share/trainyard/exports`` (never the current directory)."""
    found = Path(find_data_dir(data_dir))
    if found.is_dir():
        return found.resolve() / "exports"
    return Path.home() / ".local" / "share" / "trainyard" / "exports"


def _running(data_dir: Path) -> bool:
    return (data_dir / STATE_FILE).is_file()


def find_data_dir(data_dir: str | None) -> str:
    """The data directory to use: one given (option or ``TRAINYARD_DATA_DIR``) other
    than the default; else the nearest ``.trainyard`` of a running stack in the
    current directory or above; else the per-user config's; else ``.trainyard``."""
    if data_dir and data_dir != DEFAULT_DATA_DIR:
        return data_dir
    here = Path.cwd()
    for folder in (here, *here.parents):
        if _running(folder / DEFAULT_DATA_DIR):
            return str(folder / DEFAULT_DATA_DIR)
    remembered = read_user_config().get("data_dir")
    if remembered and Path(remembered).is_dir():
        return remembered
    return DEFAULT_DATA_DIR


def state_api_url(data_dir: str) -> str | None:
    """The gateway URL a running ``trainyard up`` of ``data_dir`` wrote; None without one."""
    try:
        state = json.loads((Path(data_dir) / STATE_FILE).read_bytes())
    except (OSError, ValueError):
        return None
    url = state.get("api_url") if isinstance(state, dict) else None
    return url if isinstance(url, str) and url else None


def find_api_url(api_url: str | None, env_api_url: str, data_dir: str | None) -> str:
    """The gateway to talk to (see the module's order); ``env_api_url`` is ``TRAINYARD_API_URL``."""
    return locate_api_url(api_url, env_api_url, data_dir)[0]


def locate_api_url(api_url: str | None, env_api_url: str, data_dir: str | None) -> tuple[str, str]:
    """The gateway to talk to, and where it was found (said when it does not answer)."""
    if api_url:
        return api_url, "--api-url"
    if env_api_url:
        return env_api_url, "TRAINYARD_API_URL"
    found_dir = find_data_dir(data_dir)
    found = state_api_url(found_dir)
    if found:
        return found, f"the running stack of {found_dir}"
    remembered = read_user_config().get("api_url")
    if remembered:
        return remembered, str(user_config_path())
    return DEFAULT_API_URL, "the default: no stack found here, above or in the per-user config"
