"""The server over TLS (``--certfile``): streams, the gate, a stop.

Before the sixty-ninth session asyncio's own TLS layer ran each accepted
connection's handshake before the gate saw it: a
client could hold thousands of connections that never finished their
handshake, each for up to 10 s, and the gate (``--max-connections``,
``--max-opening-per-address``) counted none of them. Each connection now
serves its own TLS (``OneRequestConnection``), counted from its accept.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import json
import socket
import ssl

import pytest
from asr_client import connect, read_pcm
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from asr_server.transport.gate import GateOptions

from ..harness import FIXTURES, MANIFEST, ServerThread
from ..wer import wer

pytestmark = pytest.mark.e2e

HEALTH = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n"


@pytest.fixture(scope="module")
def certificate(tmp_path_factory) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """A self-signed certificate for localhost and 127.0.0.1: (the server's context, a client's that trusts it)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .sign(key, hashes.SHA256())
    )
    folder = tmp_path_factory.mktemp("tls")
    certfile, keyfile = folder / "cert.pem", folder / "key.pem"
    certfile.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    keyfile.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)  # as the CLI makes it (cli._tls)
    server.load_cert_chain(certfile, keyfile)
    return server, ssl.create_default_context(cafile=str(certfile))


async def answer(port: int, client: ssl.SSLContext, request: bytes) -> tuple[int, dict]:
    """``request`` over TLS; (HTTP status, JSON body) of the answer, read until the server closes."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port, ssl=client, server_hostname="localhost"), 30)
    try:
        writer.write(request)
        raw = await asyncio.wait_for(reader.read(), 30)  # bounded: only a broken server keeps it open
    finally:
        writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def silent(port: int, count: int) -> list[socket.socket]:
    """Connections that never start their TLS handshake (held until closed, or the server's 10 s handshake timeout)."""
    return [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(count)]


async def until(predicate, what: str) -> None:
    for _ in range(1500):  # polls, bounded (30 s): until the server's loop has seen it
        if predicate():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"not within 30 s: {what}")


def test_a_stream_over_tls_is_transcribed_while_handshakes_that_never_start_are_counted_and_refused(whisper_runner, certificate):
    server_tls, client_tls = certificate
    server = ServerThread(whisper_runner, gate=GateOptions(max_connections=0, max_opening_per_address=4), ssl=server_tls).start()
    port = server.server.port
    pcm, _ = read_pcm(str(FIXTURES / "cards_16k.wav"))

    async def main():
        async with connect(f"wss://localhost:{port}", ssl=client_tls) as stream:  # in before the flood; its request is read
            held = silent(port, 4)
            try:
                refused = await answer(port, client_tls, HEALTH)
                await stream.send_audio(pcm)
                await stream.close_stream()
                messages = [m async for m in stream]
            finally:
                for s in held:
                    s.close()
            await until(lambda: not server.server.gate.opening, "the silent connections' places given back")
            plain = socket.create_connection(("127.0.0.1", port), timeout=30)  # no TLS at all: cut off, its place given back
            plain.sendall(HEALTH)
            try:
                cut = plain.recv(100)
            except ConnectionResetError:
                cut = b""
            plain.close()
            healthy = await answer(port, client_tls, HEALTH)
        return refused, messages, stream.close_code, cut, healthy

    try:
        refused, messages, close_code, cut, healthy = asyncio.run(main())
        assert refused[0] == 503 and refused[1]["code"] == "overloaded" and "--max-opening-per-address" in refused[1]["message"], refused
        text = " ".join(m["text"] for m in messages if m["type"] == "final")
        reference = " ".join(MANIFEST["cards_16k.wav"]["references"][0])
        assert close_code == 1000 and messages[-1]["type"] == "closed" and wer(reference, text) < 0.3, text
        assert not cut.startswith(b"HTTP/")  # plain HTTP is not answered in the clear on a TLS port
        assert healthy[0] == 200 and healthy[1]["status"] == "ok"
        asyncio.run(until(lambda: server.server.gate.open == 0, "every connection's place given back"))
    finally:
        server.stop()


def test_a_stop_ends_the_tls_handshakes_under_way(whisper_runner, certificate):
    """The server's stop, its loop running on (as for a program that embeds it): no handshake goes on to a session."""
    server_tls, _ = certificate
    server = ServerThread(whisper_runner, ssl=server_tls).start()
    held = silent(server.server.port, 3)

    async def stop():
        await server.server.stop(grace_s=5)
        return len(server.server._handshakes), server.server.gate.open

    try:
        asyncio.run(until(lambda: server.server.gate.open == 3, "the connections accepted"))
        assert server.run(stop) == (0, 0)
        for s in held:
            assert s.recv(10) == b""  # closed by the stop
    finally:
        server.stop()
        for s in held:
            s.close()
