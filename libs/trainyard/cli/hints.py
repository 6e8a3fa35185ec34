"""Next steps for a command Trainyard does not have but a user of Slurm,
Kubernetes, Ray or Docker would type: ``trainyard squeue`` answers with the
Trainyard command to use instead of a bare "No such command"."""

from __future__ import annotations

from typer.core import TyperGroup

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
