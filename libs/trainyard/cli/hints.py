"""Next steps for a command Trainyard does not have but a user of Slurm,
Kubernetes, Ray or Docker would type: ``trainyard squeue`` answers with the
Trainyard command to use instead of a bare "No such command"; and for an
option ``submit`` does not have (``--gpus-per-node``, ``--node``) the option
that means it, where click would offer only the nearest spellings (``--name``
for ``--node``)."""

from __future__ import annotations

from typing import Any

from typer.core import TyperCommand, TyperGroup

try:  # typer carries its own copy of click's parser and exceptions
    from typer._click.exceptions import NoSuchOption, UsageError
except ImportError:  # pragma: no cover - a typer that uses click itself
    from click.exceptions import NoSuchOption, UsageError  # type: ignore[assignment]

_REPLICAS = "--replicas N (a job is N replicas of --gpus G GPUs each; a replica is a node's worth)"
_GPUS = "--gpus G (GPUs per replica, on one node)"
#: (command, option typed) -> the option to use; Slurm's, torchrun's, Kubernetes' and near misses
OPTION_HINTS: dict[str, dict[str, str]] = {
    "submit": {
        **dict.fromkeys(
            ("--node", "--num-nodes", "--nnodes", "--ntasks", "--workers", "--num-workers", "--world-size", "-n"),
            _REPLICAS,
        ),
        "--replica": _REPLICAS,
        **dict.fromkeys(
            ("--gpu", "--gpus-per-node", "--gpus-per-task", "--gres", "--nproc-per-node", "--nproc_per_node"), _GPUS
        ),
        "--gpus-per-replica": _GPUS,
        **dict.fromkeys(("--partition", "-p"), "--queue Q"),
        **dict.fromkeys(("--account", "-A"), "--tenant T"),
        **dict.fromkeys(("--job-name", "-J"), "--name NAME"),
        **dict.fromkeys(("--time", "-t", "--timeout", "--time-limit"), "--max-runtime SECONDS"),
        **dict.fromkeys(("--priority", "--qos"), "--priority-class CLASS"),
        **dict.fromkeys(("--chdir", "-D", "--cwd"), "--workdir DIR"),
        "--export": "--env KEY=VALUE (may repeat)",
        "--tenants": "--tenant T",
        "--queues": "--queue Q",
    }
}

#: command typed -> (the tool it comes from, the Trainyard command to use)
FROM_OTHER_TOOLS: dict[str, tuple[str, str]] = {
    "squeue": ("Slurm", "trainyard jobs (--status pending, -o wide)"),
    "sbatch": ("Slurm", "trainyard submit -f job.yaml, or trainyard submit --tenant T --gpus 8 --replicas 2 -- CMD"),
    "srun": ("Slurm", "trainyard submit --tenant T --gpus N -- CMD, then trainyard logs JOB --follow"),
    "scancel": ("Slurm", "trainyard cancel JOB"),
    "sinfo": ("Slurm", "trainyard nodes"),
    "scontrol": ("Slurm", "trainyard job JOB, or trainyard node cordon|drain|uncordon NODE"),
    "sacct": ("Slurm", "trainyard jobs --status succeeded (or failed), and trainyard usage"),
    "sreport": ("Slurm", "trainyard usage, or trainyard report"),
    "sprio": ("Slurm", "trainyard why JOB (its place in line)"),
    "get": ("kubectl", "trainyard jobs, trainyard job JOB, or trainyard nodes"),
    "describe": ("kubectl", "trainyard job JOB, or trainyard why JOB"),
    "delete": ("kubectl", "trainyard cancel JOB"),
    "create": ("kubectl", "trainyard submit -f job.yaml"),
    "top": ("kubectl", "trainyard nodes, or trainyard usage"),
    "cordon": ("kubectl", "trainyard node cordon NODE"),
    "drain": ("kubectl", "trainyard node drain NODE"),
    "uncordon": ("kubectl", "trainyard node uncordon NODE"),
    "log": ("kubectl", "trainyard logs JOB"),
    "status": ("Ray", "trainyard job JOB (one job), or trainyard jobs"),
    "run": ("Docker", "trainyard submit --tenant T --gpus N -- CMD"),
    "ps": ("Docker", "trainyard jobs"),
    "stop": ("Ray", "trainyard cancel JOB"),
    "kill": ("Docker", "trainyard cancel JOB"),
    "list": ("Ray", "trainyard jobs"),
    "ls": ("Docker", "trainyard jobs"),
    "show": ("Ray", "trainyard job JOB"),
    "start": ("Ray", "trainyard up (the stack on this machine)"),
    "queue": ("Slurm", "trainyard jobs --status pending"),
}


def hint_for(command: str) -> str | None:
    """The Trainyard command for ``command`` typed as in another tool, or None."""
    found = FROM_OTHER_TOOLS.get(command.lower())
    if found is None:
        return None
    tool, instead = found
    return f"No such command {command!r}. In Trainyard, for {tool}'s `{command}` use: {instead}"


class HintingGroup(TyperGroup):
    """The top-level command group: an unknown command another tool has gets its Trainyard equivalent."""

    def resolve_command(self, ctx, args):  # type: ignore[no-untyped-def]
        if args and self.get_command(ctx, args[0]) is None:
            hint = hint_for(args[0])
            if hint is not None:
                ctx.fail(hint)
        return super().resolve_command(ctx, args)


class HintingCommand(TyperCommand):
    """A command whose unknown options are answered with the option that means them (:data:`OPTION_HINTS`),
    else with the nearest spellings among the options ``--help`` shows (never a hidden one)."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except NoSuchOption as err:
            typed = err.option_name
            instead = OPTION_HINTS.get(self.name or "", {}).get(typed.split("=", 1)[0])
            if instead is not None:
                raise UsageError(f"No such option: {typed}; use {instead}", ctx) from None
            hidden = {name for p in self.params if getattr(p, "hidden", False) for name in p.opts}
            err.possibilities = [p for p in err.possibilities or [] if p not in hidden]
            raise
