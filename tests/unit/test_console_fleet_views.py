"""The console's fleet pages, as logic: tenants' swatches from a fixed palette
without collisions, the health marks kept apart from them, the schedulable /
in-use / total counts, node tiles that link only for roles that may follow
the link, and the node commands offered for each state."""

from __future__ import annotations

import re

import pytest

from trainyard.auth import Action, Principal, Role
from trainyard.core.health import NodeHealthRecord
from trainyard.domain.node import NodeInfo, NodeState
from trainyard_gateway.console.cluster import PALETTE, Gpu, NodeTile, palette_for, summary, view_of
from trainyard_gateway.console.nodes import refused_because, valid_ops
from trainyard_gateway.console.palette import COLOURS, PATTERNS, Palette
from trainyard_gateway.console.render import TEMPLATES, fragment, may


def tile(node_id: str, state: str, tenants: list[str | None]) -> NodeTile:
    info = NodeInfo(node_id=node_id, cluster="c1", gpu_type="H100", gpus=len(tenants))
    gpus = [Gpu(i, f"job-{t}" if t else None, t) for i, t in enumerate(tenants)]
    return NodeTile(info, state, gpus)


def test_the_tenants_the_old_hash_mixed_up_get_different_colours() -> None:
    palette = Palette(["acme", "ads", "beta", "llm"])

    colours = [palette(t).colour for t in ("acme", "ads", "beta", "llm")]

    assert len(set(colours)) == 4
    assert colours == list(COLOURS[:4]), "given out in sorted tenant order"


def test_swatches_follow_the_tenancy_order_whatever_else_is_seen() -> None:
    alone = Palette(["zeta", "alpha"])
    with_others = Palette(["zeta", "alpha"], seen=["aaa-guest", "alpha", ""])

    assert alone("alpha") == with_others("alpha") and alone("zeta") == with_others("zeta")
    assert with_others("aaa-guest").colour == COLOURS[2], "a tenant outside the tenancy comes after it"
    assert with_others("nobody").colour == "#FFFFFF" and with_others(None).colour == "#FFFFFF"


def test_beyond_the_palette_tenants_differ_by_pattern_until_every_pair_is_used() -> None:
    names = [f"t{i:02d}" for i in range(len(COLOURS) * len(PATTERNS))]
    palette = Palette(names)

    swatches = [palette(n) for n in names]

    assert len(set(swatches)) == len(names), "no two of the first 28 tenants look alike"
    assert swatches[len(COLOURS)].colour == swatches[0].colour and swatches[len(COLOURS)].pattern != "solid"
    assert {s.pattern for s in swatches} == set(PATTERNS)


def test_a_live_map_is_redrawn_whole_when_a_new_tenant_recolours_the_others() -> None:
    before = [tile("n1", "healthy", ["zed", None]), tile("n2", "healthy", [None, None])]
    after = [before[0], tile("n2", "healthy", ["adhoc", None])]  # sorts before zed; neither is in the tenancy

    shown, now = view_of(before, palette_for([], before)), view_of(after, palette_for([], after))
    kept = view_of(after, palette_for(["adhoc", "zed"], after))

    assert palette_for([], before)("zed") != palette_for([], after)("zed")
    assert shown[PALETTE] != now[PALETTE] and shown["n1"] == now["n1"], "n1 is unchanged but its colour is not"
    assert view_of(before, palette_for(["adhoc", "zed"], before))[PALETTE] == kept[PALETTE], "a tenancy holds them"


def test_health_uses_no_colour_a_tenant_may_get() -> None:
    css = (TEMPLATES.parent / "static" / "console.css").read_text()
    health_rules = [
        line for line in css.splitlines() if "hatch" in line or "s-cordoned" in line or "--in-service" in line
    ]
    hexes = {h.upper() for line in health_rules for h in re.findall(r"#[0-9a-fA-F]{6}\b", line)}

    assert health_rules and not hexes & {c.upper() for c in COLOURS}
    assert not re.search(r"--(healthy|suspect|cordoned|draining|repair|lost):", css), "no colour per health state"


def test_schedulable_counts_only_healthy_nodes_and_in_use_counts_every_held_gpu() -> None:
    tiles = [
        tile("n1", "healthy", ["acme", "acme", None, None]),
        tile("n2", "healthy", [None, None, None, None]),
        tile("n3", "cordoned", ["ads", "ads", "ads", None]),
        tile("n4", "draining", ["beta", None, None, None]),
        tile("n5", "suspect", [None, None, None, None]),
    ]

    counts = summary(tiles)

    assert (counts["gpus"], counts["schedulable"], counts["held"], counts["free"]) == (20, 8, 6, 6)
    assert counts["states"] == {"healthy": 2, "suspect": 1, "cordoned": 1, "draining": 1}
    assert counts["tenants"] == {"acme": 2, "ads": 3, "beta": 1}


@pytest.mark.parametrize(
    ("role", "links"), [(Role.ADMIN, True), (Role.OPERATOR, True), (Role.RESEARCHER, False), (Role.FINANCE, False)]
)
def test_a_node_tile_links_to_the_node_page_only_for_roles_that_may_read_it(role: Role, links: bool) -> None:
    who = Principal(subject="x:x", role=role, tenant="acme" if role is Role.RESEARCHER else None, method="token")
    t = tile("n7", "cordoned", ["ads", None])

    html = fragment("_node_tile.html", tile=t, palette=palette_for(["ads"], [t]), link=may(who, Action.NODE_HISTORY))

    assert ('href="/nodes/n7"' in html) is links
    assert html.startswith("<a ") is links and html.startswith("<div ") is not links
    assert ">cordoned</span>" in html, "a node out of service says so in words, in either mode"
    assert f"--t: {COLOURS[0]}" in html, "a cordoned node's GPUs keep their tenant's colour"


@pytest.mark.parametrize(
    ("state", "offered"),
    [
        (NodeState.HEALTHY, ["cordon", "drain"]),
        (NodeState.SUSPECT, ["cordon", "drain", "uncordon"]),
        (NodeState.CORDONED, ["drain", "uncordon"]),
        (NodeState.DRAINING, ["uncordon"]),
        (NodeState.REPAIR, ["uncordon"]),
        (NodeState.LOST, []),
    ],
)
def test_only_the_commands_the_state_machine_accepts_are_offered(state: NodeState, offered: list[str]) -> None:
    record = NodeHealthRecord(node_id="n1", state=state)

    assert valid_ops(record, now=100.0) == offered
    for op in {"cordon", "drain", "uncordon"} - set(offered):
        assert refused_because(record, op, 100.0), f"{op} on a {state.value} node says why not"
