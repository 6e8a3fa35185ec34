"""The options of a stack's NATS: cluster size, sync interval, server lists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from trainyard.bus.connection import server_urls
from trainyard.local import LocalStack, StackConfig
from trainyard.local.nats_nodes import check_nats, port_names, replicas_for, sync_for
from trainyard.local.servers import _server_config, check_sync_interval, url_with_user
from trainyard.local.supervisor import servers


@pytest.mark.parametrize(
    ("size", "asked", "sync", "replicas"),
    [
        pytest.param(1, "", "always", 1, id="one node fsyncs before each ack: acknowledged means on disk"),
        pytest.param(3, "", "default", 3, id="a cluster keeps the server default: a quorum holds each ack"),
        pytest.param(3, "always", "always", 3, id="a cluster may be asked to fsync too"),
        pytest.param(1, "1s", "1s", 1, id="a duration is passed as it is"),
    ],
)
def test_sync_interval_and_replicas_follow_the_cluster_size(size: int, asked: str, sync: str, replicas: int) -> None:
    check_nats(size, asked)
    assert sync_for(size, asked) == sync
    assert replicas_for(size) == replicas


@pytest.mark.parametrize(
    ("size", "sync", "message"),
    [
        pytest.param(2, "", "use 1 (one server) or 3 or 5", id="two nodes cannot hold a quorum through a loss"),
        pytest.param(1, "sometimes", "use always, default or a duration", id="an unknown sync interval"),
        pytest.param(1, "0s", "use always, default or a duration", id="a zero interval"),
    ],
)
def test_bad_nats_options_say_what_to_use(size: int, sync: str, message: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        LocalStack(StackConfig(data_dir=str(tmp_path), nats_cluster=size, nats_sync=sync))


def test_a_cluster_keeps_a_client_and_a_cluster_port_per_node() -> None:
    assert port_names(1) == []
    assert port_names(3) == ["nats-2", "nats-3", "nats-cluster-1", "nats-cluster-2", "nats-cluster-3"]


def test_the_server_config_sets_the_sync_interval_and_includes_the_users_by_a_relative_path(tmp_path: Path) -> None:
    users = tmp_path / "bus" / "nats.conf"
    node = tmp_path / "nats-cluster" / "nats-1"
    node.mkdir(parents=True)
    written = _server_config(node, users, "always")
    assert written is not None
    assert written.read_text().splitlines()[1:] == [
        'jetstream { sync_interval: "always" }',
        'include "../../bus/nats.conf"',
    ]
    assert _server_config(node, users, "default") == users
    assert _server_config(node, None, None) is None
    assert check_sync_interval("250ms") == "250ms"


def test_a_server_list_is_split_and_each_url_carries_the_user() -> None:
    urls = "nats://127.0.0.1:1, nats://127.0.0.1:2"
    assert server_urls(urls) == ["nats://127.0.0.1:1", "nats://127.0.0.1:2"]
    assert url_with_user(urls, "admin", "p w") == "nats://admin:p%20w@127.0.0.1:1,nats://admin:p%20w@127.0.0.1:2"
    with pytest.raises(ValueError, match="no NATS server URL"):
        server_urls(" , ")


class _Node:
    def __init__(self, name: str) -> None:
        self.name = name


class _ClusterStack:
    procs: dict = {}
    redis = _Node("redis")

    def __init__(self) -> None:
        self.nats_nodes = [_Node("nats-1"), _Node("nats-2"), _Node("nats-3")]
        self.nats = self.nats_nodes[0]


def test_the_supervisor_watches_each_node_of_a_cluster_under_its_own_name() -> None:
    assert list(servers(_ClusterStack())) == ["nats-1", "nats-2", "nats-3", "redis"]
