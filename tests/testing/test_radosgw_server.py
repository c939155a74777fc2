"""chunkstore.testing.radosgw against a real Ceph (mon, memstore OSD, radosgw), through boto3: the
module's gateway serves S3 on 127.0.0.1 only and answers conditional PUTs; stopping the gateway
alone is a connection error and starting it again serves the same objects; a gateway of a test's
own stops every daemon by its PID; a missing install and a start that fails say what to do.

The gateway tests skip where Ceph's binaries are missing, except under CI (the CI variable set),
where they fail."""

from __future__ import annotations

import errno
import os
import socket
import time
from pathlib import Path

import pytest

from chunkstore.testing.radosgw import (
    INSTALL_HINT,
    MAX_RUN_DIR_BYTES,
    RadosGateway,
    RadosGatewayError,
    RadosGatewayNotInstalled,
    error_lines,
    exit_meaning,
)

LOOPBACK_HEX = "0100007F"  # 127.0.0.1 as /proc/net/tcp writes it
TCP_LISTEN = "0A"


@pytest.fixture(scope="module")
def installed() -> None:
    try:
        RadosGateway.find_binaries()
    except RadosGatewayNotInstalled as error:
        if os.environ.get("CI"):
            pytest.fail(f"{error} (CI is set, so these tests may not skip)", pytrace=False)
        pytest.skip(str(error))
    pytest.importorskip("boto3")


@pytest.fixture(scope="module")
def rgw(installed, tmp_path_factory):
    """One gateway for the module; a test that stops it starts it again before it ends."""
    with RadosGateway(tmp_path_factory.mktemp("rgw")) as gateway:
        yield gateway


@pytest.fixture(scope="module")
def bucket(rgw) -> str:
    rgw.create_bucket("chunks")
    return "chunks"


def impatient_client(rgw):
    """A client that fails at once when the gateway is away (no retries, a short connect)."""
    return rgw.client(retries={"max_attempts": 1}, connect_timeout=2, read_timeout=10)


def refuses(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(2)
        return sock.connect_ex(("127.0.0.1", port)) == errno.ECONNREFUSED


def listening_addresses(pid: int) -> list[tuple[str, str, int]]:
    """(family, address in /proc's hex, port) of every TCP socket that `pid` listens on."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    found = []
    for family in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{family}").read_text().splitlines()[1:]:
            fields = line.split()
            address, port_hex = fields[1].split(":")
            if fields[3] == TCP_LISTEN and fields[9] in inodes:
                found.append((family, address, int(port_hex, 16)))
    return found


def test_put_get_list_delete(rgw, bucket):
    client = rgw.client()
    client.put_object(Bucket=bucket, Key="a/one.kv", Body=b"payload one")
    client.put_object(Bucket=bucket, Key="a/two.kv", Body=b"payload two")
    assert client.get_object(Bucket=bucket, Key="a/one.kv")["Body"].read() == b"payload one"
    listed = client.list_objects_v2(Bucket=bucket, Prefix="a/")
    assert [item["Key"] for item in listed["Contents"]] == ["a/one.kv", "a/two.kv"]
    client.delete_object(Bucket=bucket, Key="a/one.kv")
    with pytest.raises(client.exceptions.NoSuchKey):
        client.get_object(Bucket=bucket, Key="a/one.kv")
    assert [item["Key"] for item in client.list_objects_v2(Bucket=bucket, Prefix="a/")["Contents"]] == ["a/two.kv"]
    assert rgw.endpoint_url == f"http://127.0.0.1:{rgw.port}"
    assert rgw.startup_s is not None and rgw.startup_s < rgw.start_timeout_s


def test_a_conditional_put_on_an_existing_key_is_412(rgw, bucket):
    from botocore.exceptions import ClientError

    client = rgw.client()
    client.put_object(Bucket=bucket, Key="once.kv", Body=b"first", IfNoneMatch="*")
    with pytest.raises(ClientError) as raised:
        client.put_object(Bucket=bucket, Key="once.kv", Body=b"second", IfNoneMatch="*")
    assert raised.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412
    assert client.get_object(Bucket=bucket, Key="once.kv")["Body"].read() == b"first"


def test_every_daemon_listens_on_127_0_0_1_only(rgw):
    assert set(rgw.pids) == {"mon", "osd", "rgw"}
    addresses = {name: listening_addresses(pid) for name, pid in rgw.pids.items()}
    assert all(addresses.values()), addresses  # each daemon listens on something
    assert ("tcp", LOOPBACK_HEX, rgw.port) in addresses["rgw"]
    assert {(family, address) for found in addresses.values() for family, address, _ in found} == {
        ("tcp", LOOPBACK_HEX)}, addresses


@pytest.mark.slow  # several seconds: CI runs it, the fast subset does not
@pytest.mark.parametrize("kill", [False, True], ids=["sigterm", "sigkill"])
def test_a_stopped_gateway_is_a_connection_error_and_comes_back_with_the_data(rgw, bucket, kill):
    from botocore.exceptions import ConnectionError as BotoConnectionError

    client = impatient_client(rgw)
    client.put_object(Bucket=bucket, Key=f"kept-{kill}.kv", Body=b"kept")
    cluster_pids = {name: pid for name, pid in rgw.pids.items() if name != "rgw"}
    gateway_pid = rgw.gateway_pid
    rgw.stop_gateway(kill=kill)
    try:
        assert rgw.gateway_pid is None and not rgw.is_running
        with pytest.raises(ProcessLookupError):
            os.kill(gateway_pid, 0)
        assert refuses(rgw.port)
        with pytest.raises(BotoConnectionError):
            client.get_object(Bucket=bucket, Key=f"kept-{kill}.kv")
        rgw.stop_gateway()  # idempotent
    finally:
        rgw.start_gateway()
    assert rgw.is_running and rgw.gateway_pid != gateway_pid
    assert {name: pid for name, pid in rgw.pids.items() if name != "rgw"} == cluster_pids
    assert rgw.endpoint_url == f"http://127.0.0.1:{rgw.port}"
    assert client.get_object(Bucket=bucket, Key=f"kept-{kill}.kv")["Body"].read() == b"kept"
    assert rgw.gateway_startup_s is not None and rgw.gateway_startup_s < rgw.start_timeout_s
    with pytest.raises(RadosGatewayError, match="already started"):
        rgw.start_gateway()


@pytest.mark.slow  # several seconds: CI runs it, the fast subset does not
def test_stop_kills_every_daemon_and_removes_the_scratch_folder(installed, tmp_path):
    folder = tmp_path / ("long-" * 16) / "rgw"  # too long for a socket's path: a scratch folder
    gateway = RadosGateway(folder)
    gateway.start()
    try:
        pids = gateway.pids
        scratch = gateway._scratch
        assert scratch is not None and scratch.exists() and str(scratch).startswith("/tmp/")
        assert len(os.fsencode(gateway._run_dir)) <= MAX_RUN_DIR_BYTES
        assert any(path.suffix == ".asok" for path in gateway._run_dir.iterdir())
        for pid in pids.values():
            os.kill(pid, 0)  # alive
    finally:
        gateway.stop()
    assert gateway.pids == {} and not gateway.is_running
    for pid in pids.values():
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # gone, and reaped
    assert not scratch.exists()
    assert refuses(gateway.port)
    assert gateway.gateway_log_path.is_relative_to(folder)
    gateway.stop()  # idempotent


@pytest.mark.slow  # several seconds: CI runs it, the fast subset does not
def test_a_new_start_after_stop_is_an_empty_cluster(installed, tmp_path):
    gateway = RadosGateway(tmp_path / "rgw")
    try:
        gateway.start()
        gateway.create_bucket("first-life")
        first_pids = gateway.pids
        gateway.stop()
        gateway.start()  # the same folder and port, a new fsid and new keys
        assert gateway.client().list_buckets()["Buckets"] == []
        assert set(gateway.pids.values()).isdisjoint(first_pids.values())
    finally:
        gateway.stop()


@pytest.mark.slow  # several seconds: CI runs it, the fast subset does not
def test_a_taken_port_fails_fast_naming_the_log_and_stops_the_rest(installed, tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        gateway = RadosGateway(tmp_path / "rgw", port=taken.getsockname()[1], start_timeout_s=60)
        began = time.monotonic()
        with pytest.raises(RadosGatewayError) as raised:
            gateway.start()
        assert time.monotonic() - began < 60  # it saw radosgw exit, it did not wait out the bound
    message = str(raised.value)
    assert str(gateway.gateway_log_path) in message
    # The port named whatever radosgw's exit: 98 read as the errno it is (its log thread may not
    # have written its own line), or now and then a crash on its way out (-11).
    assert f"port {gateway.port} is taken by another process" in message
    assert "exited with 98 (EADDRINUSE: Address already in use)" in message or "exited with -11" in message
    assert gateway.pids == {} and gateway._scratch is None


def test_an_exit_status_is_read_as_the_errno_it_names():
    assert exit_meaning(98) == "98 (EADDRINUSE: Address already in use)"  # radosgw's for a taken port
    assert exit_meaning(1) == "1" and exit_meaning(-9) == "-9"  # a plain failure, a signal: no errno
    assert exit_meaning(100000) == "100000"


def test_error_lines_quotes_the_last_launch_only_and_not_a_crash_dump(tmp_path):
    log = tmp_path / "radosgw.log"
    old = "2026-01-01T00:00:00.000+0000 7f00 -1 an error of an earlier start\n"
    log.write_text(old + "2026-01-01T00:00:01.000+0000 7f00  0 starting handler: beast\n\n"
                   "2026-01-01T00:00:01.004+0000 7f00 -1 failed to bind address 127.0.0.1:1: Address already in use\n"
                   "    -1> 2026-01-01T00:00:01.004+0000 7f00 -1 failed to bind address (the crash dump)\n"
                   "*** Caught signal (Segmentation fault) **\n")
    assert error_lines(log, len(old)) == (
        "2026-01-01T00:00:01.004+0000 7f00 -1 failed to bind address 127.0.0.1:1: Address already in use")
    assert error_lines(log, log.stat().st_size) == "(none logged)"
    assert "could not be read" in error_lines(tmp_path / "missing.log", 0)


def test_a_missing_install_says_how_to_install(tmp_path):
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "ceph-mon").touch(mode=0o755)  # one of them is not enough
    with pytest.raises(RadosGatewayNotInstalled, match="apt-get install") as raised:
        RadosGateway(tmp_path / "rgw", bin_dir=tmp_path / "bin")
    assert INSTALL_HINT in str(raised.value)
    assert str(raised.value).startswith(
        f"Ceph's binaries ceph-authtool, monmaptool, ceph-osd, radosgw, radosgw-admin, ceph were not "
        f"found in {tmp_path / 'bin'}: ")
    assert isinstance(raised.value, RadosGatewayError)
    assert not (tmp_path / "rgw").exists()  # nothing made before the check
