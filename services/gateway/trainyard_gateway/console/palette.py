"""How the console tells tenants and node health apart.

Tenants get the colours of the Okabe–Ito palette (safe for the common
colour-vision deficiencies), given out in a fixed order: first the tenants
of the tenancy configuration, sorted by name, then any other tenant seen,
sorted.  Two tenants share a colour only beyond the seven colours, and then
they differ by the pattern laid over it (stripes, dots, a grid), so the
first 28 tenants never look alike.  Colours therefore depend on the tenancy,
not on a hash of the name, and are the same on every page and gateway.

Health never uses a colour: black, greys and hatching are reserved for it
(a hatched node is out of service, a dotted outline is suspect), and a node
that is not healthy also says its state in words on its tile."""

from __future__ import annotations

from collections.abc import Iterable

import msgspec
from nats.js.errors import BadRequestError, KeyNotFoundError, NoKeysError, NotFoundError

from trainyard.bus import Bus
from trainyard.config.store import BUCKET, TENANCY_KEY
from trainyard.config.tenancy import TenancyConfigError, load_tenancy

#: Okabe & Ito (2008), without black, which health keeps: orange, sky blue,
#: bluish green, yellow, blue, vermillion, reddish purple.
COLOURS = ("#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7")
#: Laid over a colour once every colour is taken ("solid": none).
PATTERNS = ("solid", "stripes", "dots", "grid")
#: What a GPU held by a run the console has not read yet looks like.
UNKNOWN_COLOUR = "#FFFFFF"

#: Node states, with how each is drawn and what it means (the health legend).
HEALTH = {
    "healthy": "takes new work",
    "suspect": "a check failed; still takes work",
    "cordoned": "takes no new work",
    "draining": "takes no new work; its runs move elsewhere",
    "repair": "out of service, being repaired",
    "lost": "no heartbeat",
}


class Swatch(msgspec.Struct, frozen=True):
    colour: str
    pattern: str = "solid"

    @property
    def css(self) -> str:
        return f"pat-{self.pattern}"


class Palette:
    """Each tenant's swatch: ``order`` is the tenancy's tenants, ``seen`` any
    others the page shows (a name in both counts once, in the tenancy's place)."""

    def __init__(self, order: Iterable[str] = (), seen: Iterable[str] = ()) -> None:
        ordered = sorted(set(order))
        ordered += sorted({s for s in seen if s} - set(ordered))
        n = len(COLOURS)
        self.swatches = {
            name: Swatch(COLOURS[i % n], PATTERNS[(i // n) % len(PATTERNS)]) for i, name in enumerate(ordered)
        }

    def __call__(self, name: str | None) -> Swatch:
        if not name or name not in self.swatches:
            return Swatch(UNKNOWN_COLOUR)
        return self.swatches[name]

    def legend(self, shown: Iterable[str]) -> list[tuple[str, Swatch]]:
        """The swatches of the names ``shown``, in palette order."""
        wanted = set(shown)
        return [(name, sw) for name, sw in self.swatches.items() if name in wanted]


async def tenancy_tenants(bus: Bus) -> list[str]:
    """The tenants (teams) of the applied tenancy configuration, sorted; none
    when no configuration is applied or it does not load."""
    try:
        kv = await bus.js.key_value(BUCKET)
        entry = await kv.get(TENANCY_KEY)
    except (NotFoundError, BadRequestError, KeyNotFoundError, NoKeysError):
        return []
    if entry.value is None:
        return []
    try:
        cfg = load_tenancy(entry.value.decode())
    except TenancyConfigError:
        return []
    return sorted({team.name for org in cfg.organisations for team in org.teams})
