"""The demo upstream's self-signed certificate: for the given names, loadable, verifiable."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
import stat
from pathlib import Path

import pytest
from cryptography import x509

from hopmeter.upstream.tls import VALID_DAYS, make_self_signed, server_context


def _handshake(server: ssl.SSLContext, client: ssl.SSLContext, name: str) -> ssl.SSLObject:
    """A whole TLS handshake between the two contexts in memory; the client's side."""
    c_in, c_out, s_in, s_out = (ssl.MemoryBIO() for _ in range(4))
    c = client.wrap_bio(c_in, c_out, server_hostname=name)
    s = server.wrap_bio(s_in, s_out, server_side=True)
    done = {"c": False, "s": False}
    for _ in range(10):
        for key, side in (("c", c), ("s", s)):
            if not done[key]:
                try:
                    side.do_handshake()
                    done[key] = True
                except ssl.SSLWantReadError:
                    pass
        s_in.write(c_out.read())
        c_in.write(s_out.read())
        if all(done.values()):
            return c
    raise AssertionError("the handshake did not finish")


def _client(cert: Path) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(cert))
    ctx.set_alpn_protocols(["h2", "http/1.1"])
    return ctx


def test_the_certificate_names_every_host_given(tmp_path: Path) -> None:
    """IP addresses become IP names and host names DNS names, valid from now for VALID_DAYS."""
    cert_path, key_path = make_self_signed(tmp_path / "tls", ("127.0.0.1", "::1", "demo.test"))
    assert (cert_path, key_path) == (tmp_path / "tls" / "cert.pem", tmp_path / "tls" / "key.pem")
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.IPAddress) == [
        ipaddress.ip_address("127.0.0.1"),
        ipaddress.ip_address("::1"),
    ]
    assert sans.get_values_for_type(x509.DNSName) == ["demo.test"]
    now = datetime.datetime.now(datetime.UTC)
    assert cert.not_valid_before_utc <= now < cert.not_valid_after_utc
    assert cert.not_valid_after_utc - now <= datetime.timedelta(days=VALID_DAYS)


def test_the_private_key_is_readable_by_its_owner_only(tmp_path: Path) -> None:
    """The key file is written with mode 0600."""
    _, key_path = make_self_signed(tmp_path)
    assert stat.S_IMODE(key_path.stat().st_mode) == 0o600


@pytest.mark.parametrize("name", ["localhost", "127.0.0.1"])
def test_a_client_trusting_the_certificate_verifies_the_server(tmp_path: Path, name: str) -> None:
    """The server context loads the pair, and a client that trusts cert.pem completes a verified
    handshake for each default name, agreeing on HTTP/1.1."""
    cert, key = make_self_signed(tmp_path)
    client = _handshake(server_context(cert, key), _client(cert), name)
    assert client.selected_alpn_protocol() == "http/1.1"
    assert client.getpeercert() is not None


def test_a_name_not_given_fails_verification(tmp_path: Path) -> None:
    """A host name the certificate was not made for is refused by a verifying client."""
    cert, key = make_self_signed(tmp_path)
    with pytest.raises(ssl.SSLCertVerificationError, match="Hostname mismatch"):
        _handshake(server_context(cert, key), _client(cert), "example.com")
