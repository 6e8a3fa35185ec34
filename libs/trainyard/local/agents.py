"""The node agents of a local stack: one process per node (``agent-a00``, ...),
each running the jobs placed on its node for real, on fake GPUs unless told to
use the machine's own (NVML)."""

from __future__ import annotations

import sys
from pathlib import Path

from trainyard.local.credentials import Credentials

#: A node agent's command after ``python``; the stack adds its node, rack, state directory and GPUs.
AGENT_COMMAND = ["-m", "trainyard.cli.main", "agent"]
PREFIX = "agent-"


def agent_nodes(count: int) -> list[str]:
    """The node ids of ``count`` agents: a00, a01, ..."""
    return [f"a{i:02d}" for i in range(count)]


def agent_process(node: str) -> str:
    """The stack's name for the agent process of ``node`` (also its NATS user)."""
    return f"{PREFIX}{node}"


def is_agent(name: str) -> bool:
    return name.startswith(PREFIX)


def agent_command(name: str, data_dir: Path, agents: int, racks: int, fake_gpus: int) -> list[str]:
    """The command line of agent process ``name``: its node id, a rack (agents are
    spread over ``racks``), its state directory under the data directory, and its GPUs."""
    node = name.removeprefix(PREFIX)
    index = agent_nodes(agents).index(node)
    command = [
        sys.executable,
        *AGENT_COMMAND,
        "--node-id",
        node,
        "--rack",
        f"r{index % max(1, min(racks, agents)) + 1}",
        "--state-dir",
        str(data_dir / "agents" / node),
        "--address",
        "127.0.0.1",
    ]
    if fake_gpus:
        command += ["--fake-gpus", str(fake_gpus), "--gpu-type", "H100"]
    return command


def agent_env(env: dict[str, str], credentials: Credentials | None, name: str) -> dict[str, str]:
    """An agent's environment: the stack's settings without Redis (an agent has
    none) and, on a locked bus, its node's own NATS user."""
    out = {k: v for k, v in env.items() if not k.startswith("TRAINYARD_REDIS")}
    if credentials is not None:
        user = credentials.nats_user(name)
        out |= {"TRAINYARD_NATS_USER": user.name, "TRAINYARD_NATS_PASSWORD": user.password}
    return out
