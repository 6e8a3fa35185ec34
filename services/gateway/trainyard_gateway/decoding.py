"""Decoding request bodies with msgspec, with a bad field named the way
``validate_job_spec`` names fields (``roles[0].replicas``), for REST, gRPC
and the console's job form alike."""

from __future__ import annotations

import msgspec

from trainyard.domain.job import TopologyLevel, ValidationError
from trainyard_gateway.jobs import InvalidRequest
from trainyard_gateway.schema import SubmitJobBody

_submission = msgspec.json.Decoder(SubmitJobBody)


def decode_errors(err: msgspec.MsgspecError, root: str = "body") -> list[ValidationError]:
    """Turn a msgspec decode/convert error into a field error named like
    ``validate_job_spec`` names fields (``roles[0].replicas``)."""
    if not isinstance(err, msgspec.ValidationError):  # ValidationError subclasses DecodeError
        return [ValidationError(root, f"the body is not valid JSON: {err}")]
    text = str(err)
    message, _, rest = text.partition(" - at `$")
    path = rest.rstrip("`").lstrip(".") if rest else ""
    if message.startswith("Object missing required field `") and message.endswith("`"):
        name = message.removeprefix("Object missing required field `").removesuffix("`")
        path, message = (f"{path}.{name}" if path else name), "is required"
    if message.startswith("Invalid enum value") and path.endswith("level"):
        message += "; use one of " + ", ".join(level.value for level in TopologyLevel)
    return [ValidationError(path or root, message.replace("`", ""))]


def decode_submission(raw: bytes) -> SubmitJobBody:
    try:
        return _submission.decode(raw)
    except msgspec.MsgspecError as err:
        raise InvalidRequest(decode_errors(err)) from err
    except RecursionError:  # msgspec's depth limit, reached by nesting in an unknown field
        raise InvalidRequest([ValidationError("body", "nested too deeply; a job spec is a few levels deep")]) from None
