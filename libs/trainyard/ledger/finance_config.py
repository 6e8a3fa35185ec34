"""Where the gateway and the CLI find the rate card and the cost-centre map.

- ``TRAINYARD_RATE_CARD`` -- path of the rate card (JSON, or YAML when the
  name ends in ``.yaml``/``.yml``).  Default: ``examples/rate-card.json`` of
  the source checkout Trainyard runs from (what a local stack uses).
- ``TRAINYARD_COST_CENTRES`` -- path of the tenant -> cost-centre map (YAML
  or JSON).  Default: ``examples/cost-centres.yaml`` of the checkout; with no
  file at all every tenant is ``unassigned``.

Files are read on every call, so a new rate card version is picked up
without a restart.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec

from trainyard.core.accounting.costcentres import load_cost_centres
from trainyard.core.accounting.pricing import RateCard, RateCardError, load_rate_card

RATE_CARD_ENV = "TRAINYARD_RATE_CARD"
COST_CENTRES_ENV = "TRAINYARD_COST_CENTRES"
EXAMPLES = Path(__file__).resolve().parents[3] / "examples"  # <checkout>/examples


def _parse(path: Path) -> Any:
    try:
        text = path.read_bytes()
    except OSError as exc:
        raise RateCardError(f"cannot read {path}: {exc.strerror}") from exc
    try:
        if path.suffix in (".yaml", ".yml"):
            return msgspec.yaml.decode(text)
        return json.loads(text)
    except (msgspec.DecodeError, ValueError) as exc:
        raise RateCardError(f"{path} is not valid {path.suffix.lstrip('.') or 'JSON'}: {exc}") from exc


def rate_card_path(environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    if env.get(RATE_CARD_ENV):
        return Path(env[RATE_CARD_ENV])
    default = EXAMPLES / "rate-card.json"
    if default.exists():
        return default
    raise RateCardError(f"no rate card: set {RATE_CARD_ENV} to the path of a rate card (see docs/accounting.md)")


def cost_centres_path(environ: Mapping[str, str] | None = None) -> Path | None:
    env = os.environ if environ is None else environ
    if env.get(COST_CENTRES_ENV):
        return Path(env[COST_CENTRES_ENV])
    default = EXAMPLES / "cost-centres.yaml"
    return default if default.exists() else None


def read_rate_card(path: Path | None = None, environ: Mapping[str, str] | None = None) -> RateCard:
    """The rate card at ``path`` (default: from the environment); raises
    :class:`RateCardError` saying which file and what to fix."""
    path = path or rate_card_path(environ)
    try:
        return load_rate_card(_parse(path))
    except RateCardError as exc:
        raise RateCardError(f"{path}: {exc}") from exc


def read_cost_centres(path: Path | None = None, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    path = path or cost_centres_path(environ)
    if path is None:
        return {}
    try:
        return load_cost_centres(_parse(path))
    except RateCardError as exc:
        raise RateCardError(f"{path}: {exc}") from exc
