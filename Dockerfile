# One image for every Trainyard process. compose.yaml runs it once per service and
# overrides the command (`python -m trainyard_<service>` or `trainyard emulate run`).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /opt/trainyard

# Only what the wheel is built from, so a local .venv or .git never enters the image.
COPY pyproject.toml README.md ./
COPY libs/ libs/
COPY services/ services/

RUN pip install . \
 && useradd --system --create-home --uid 10001 trainyard \
 && mkdir /data \
 && chown trainyard /data

USER trainyard
# Run from a directory without sources, so the installed packages are the ones imported.
WORKDIR /home/trainyard

# REST and gRPC ports of the gateway.
EXPOSE 8080 50051

CMD ["trainyard", "--help"]
