"""Where the gateway and the CLI find the rate card and the cost-centre map.

- ``TRAINYARD_RATE_CARD`` -- path of the rate card (JSON, or YAML when the
  name ends in ``.yaml``/``.yml``).  Default: ``examples/rate-card.json`` of
  the source checkout Trainyard runs from (what a local stack uses).
- ``TRAINYARD_COST_CENTRES`` -- path of the tenant -> cost-centre map (YAML
  or JSON).  Default: ``examples/cost-centres.yaml`` of the checkout; with no
  file at all every tenant is ``unassigned``.

Both are read with the other settings (:mod:`trainyard.settings`).  Files are
read on every call, so a new rate card version is picked up without a restart.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec

from trainyard.core.accounting.costcentres import load_cost_centres
from trainyard.core.accounting.pricing import RateCard, RateCardError, load_rate_card
from trainyard.settings import Settings, load_settings, variable
from trainyard.yaml_input import YamlTooLarge, check_yaml

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"  # <checkout>/examples


def _parse(path: Path) -> Any:
    try:
        text = path.read_bytes()
    except OSError as exc:
        raise RateCardError(f"cannot read {path}: {exc.strerror}") from exc
    try:
        if path.suffix in (".yaml", ".yml"):
            check_yaml(text, str(path))
            return msgspec.yaml.decode(text)
        return json.loads(text)
    except YamlTooLarge as exc:
        raise RateCardError(str(exc)) from None
    except (msgspec.DecodeError, ValueError) as exc:
        raise RateCardError(f"{path} is not valid {path.suffix.lstrip('.') or 'JSON'}: {exc}") from exc


def rate_card_path(settings: Settings | None = None) -> Path:
    settings = settings or load_settings()
    if settings.rate_card:
        return Path(settings.rate_card)
    default = EXAMPLES / "rate-card.json"
    if default.exists():
        return default
    raise RateCardError(
        f"no rate card: set {variable('rate_card')} to the path of a rate card (see docs/accounting.md)"
    )


def cost_centres_path(settings: Settings | None = None) -> Path | None:
    settings = settings or load_settings()
    if settings.cost_centres:
        return Path(settings.cost_centres)
    default = EXAMPLES / "cost-centres.yaml"
    return default if default.exists() else None


def read_rate_card(path: Path | None = None, settings: Settings | None = None) -> RateCard:
    """The rate card at ``path`` (default: where the settings, else this
    process's environment, say); raises :class:`RateCardError` saying which
    file and what to fix."""
    path = path or rate_card_path(settings)
    try:
        return load_rate_card(_parse(path))
    except RateCardError as exc:
        raise RateCardError(f"{path}: {exc}") from exc


def read_cost_centres(path: Path | None = None, settings: Settings | None = None) -> dict[str, str]:
    path = path or cost_centres_path(settings)
    if path is None:
        return {}
    try:
        return load_cost_centres(_parse(path))
    except RateCardError as exc:
        raise RateCardError(f"{path}: {exc}") from exc
