"""The reader service secured: TLS (in-process and CLI), shared-token auth everywhere, health checks over TLS."""

import datetime
import ipaddress
import json
import pathlib
import signal

import grpc
import pyarrow.flight as flight
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from grpc_health.v1 import health_pb2

import reader
from reader.service import DispatcherConfig, DispatchServer, ServerSecurity, WorkerConfig, WorkerServer
from reader.service.__main__ import main
from reader.service.client import connection
from tests.reader.service.probes import health, ids_of, start_process, wait_for_workers

TOKEN = "s3cret"


def self_signed(directory, name="server"):
    """A certificate for localhost and 127.0.0.1 that is its own CA: (cert path, key path)."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / f"{name}.pem", directory / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return str(cert_path), str(key_path)


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    directory = tmp_path_factory.mktemp("certs")
    cert, key = self_signed(directory)
    other_cert, _ = self_signed(directory, "other")
    return {"cert": cert, "key": key, "other_ca": other_cert}


@pytest.fixture
def tls_cluster(certs):
    """A TLS dispatcher and two TLS workers that verify it with the same self-signed certificate."""
    dispatcher = DispatchServer(
        DispatcherConfig(security=ServerSecurity(tls_cert=certs["cert"], tls_key=certs["key"]))
    ).start()
    workers = [
        WorkerServer(
            WorkerConfig(
                dispatcher_address=dispatcher.target,
                dispatcher_tls_ca=certs["cert"],
                security=ServerSecurity(tls_cert=certs["cert"], tls_key=certs["key"]),
            )
        ).start()
        for _ in range(2)
    ]
    wait_for_workers(dispatcher.target, 2, ca=certs["cert"])
    yield dispatcher, workers
    for worker in workers:
        worker.stop()
    dispatcher.stop()


def test_tls_service_delivers_every_row_exactly_once_and_every_worker_in_parallel_epochs(
    tls_cluster, certs, range_root, uneven_snapshot
):
    dispatcher, _ = tls_cluster
    ca = certs["cert"]
    once = reader.distributed_dataset(
        uneven_snapshot, 64, service=reader.ServiceOptions(address=dispatcher.target, tls_ca=ca)
    )
    assert ids_of(once) == {i: 1 for i in range(2000)}
    parallel = reader.distributed_dataset(
        range_root / "range10",
        4,
        service=reader.ServiceOptions(address=dispatcher.target, processing_mode="parallel_epochs", tls_ca=ca),
    )
    assert ids_of(parallel) == {i: 2 for i in range(10)}


def test_health_checks_over_tls_on_the_dispatcher_and_the_workers(tls_cluster, certs):
    dispatcher, workers = tls_cluster
    assert dispatcher.health_target == dispatcher.target
    for target in [dispatcher.health_target, *(worker.health_target for worker in workers)]:
        assert health(target, ca=certs["cert"]) == health_pb2.HealthCheckResponse.SERVING
    with pytest.raises(grpc.RpcError) as plaintext:
        health(workers[0].health_target)
    assert plaintext.value.code() == grpc.StatusCode.UNAVAILABLE, "TLS only: a plaintext probe is not answered"


def test_a_tls_mismatch_fails_at_once_saying_what_to_change(tls_cluster, certs, range_root):
    dispatcher, _ = tls_cluster
    path = range_root / "range10"
    with pytest.raises(reader.UsageError, match=rf"{dispatcher.target} serves TLS; pass tls_ca=<the CA"):
        list(reader.distributed_dataset(path, 4, service=dispatcher.target))
    with pytest.raises(reader.UsageError, match=r"certificate that tls_ca does not verify"):
        list(
            reader.distributed_dataset(
                path, 4, service=reader.ServiceOptions(address=dispatcher.target, tls_ca=certs["other_ca"])
            )
        )
    plaintext = DispatchServer().start()
    try:
        with pytest.raises(reader.UsageError, match=rf"{plaintext.target} does not serve TLS; drop tls_ca"):
            list(
                reader.distributed_dataset(
                    path, 4, service=reader.ServiceOptions(address=plaintext.target, tls_ca=certs["cert"])
                )
            )
    finally:
        plaintext.stop()
    with pytest.raises(connection.ServiceUnavailableError, match="unreachable"):  # nothing listening: still an outage
        unreachable = "grpc://127.0.0.1:1"
        list(
            reader.distributed_dataset(
                path, 4, service=reader.ServiceOptions(address=unreachable, tls_ca=certs["cert"], timeout_seconds=1)
            )
        )


def test_unusable_tls_files_are_usage_errors_naming_the_option_and_file(certs, range_root, tmp_path):
    missing = str(tmp_path / "missing.pem")
    with pytest.raises(reader.UsageError, match=rf"--tls_cert={missing} --tls_key=.*No such file"):
        DispatchServer(DispatcherConfig(security=ServerSecurity(tls_cert=missing, tls_key=certs["key"])))
    with pytest.raises(reader.UsageError, match=r"^tls_cert \(--tls_cert\) needs tls_key \(--tls_key\) too"):
        ServerSecurity(tls_cert=certs["cert"])  # refused as the config is made, before any server
    with pytest.raises(reader.UsageError, match=r"--tls_key=.*not a readable PEM certificate and its"):
        DispatchServer(
            DispatcherConfig(security=ServerSecurity(tls_cert=certs["cert"], tls_key=certs["other_ca"]))
        )  # a certificate is no key
    with pytest.raises(reader.UsageError, match=rf"--dispatcher_tls_ca={missing}: not a readable PEM CA"):
        WorkerServer(WorkerConfig(dispatcher_address="grpc://127.0.0.1:1", dispatcher_tls_ca=missing))
    with pytest.raises(reader.UsageError, match=rf"^tls_ca={certs['key']}: not a readable PEM CA"):
        reader.distributed_dataset(
            range_root / "range10", 4, service=reader.ServiceOptions(address="grpc://127.0.0.1:1", tls_ca=certs["key"])
        )
    assert main(["dispatcher", "--port=0", "--tls_cert", missing, "--tls_key", certs["key"]]) == 2


def test_parallel_epochs_under_auth_send_the_token_to_every_worker(range_root):
    dispatcher = DispatchServer(DispatcherConfig(security=ServerSecurity(auth_token=TOKEN))).start()
    workers = [
        WorkerServer(
            WorkerConfig(dispatcher_address=dispatcher.target, security=ServerSecurity(auth_token=TOKEN))
        ).start()
        for _ in range(2)
    ]
    try:
        wait_for_workers(dispatcher.target, 2, token=TOKEN)
        dataset = reader.distributed_dataset(
            range_root / "range10",
            4,
            service=reader.ServiceOptions(
                address=dispatcher.target, processing_mode="parallel_epochs", auth_token=TOKEN
            ),
        )
        assert ids_of(dataset) == {i: 2 for i in range(10)}
    finally:
        for worker in workers:
            worker.stop()
        dispatcher.stop()


def test_cli_processes_with_token_and_tls_serve_reads_status_and_health(certs, uneven_snapshot, tmp_path, capsys):
    token_file = tmp_path / "token"
    token_file.write_text(f"{TOKEN}\n")
    cert, key = certs["cert"], certs["key"]
    secured = [f"--auth_token_file={token_file}", f"--tls_cert={cert}", f"--tls_key={key}"]
    dispatcher, target, dispatcher_health = start_process("dispatcher", "--port=0", *secured)
    workers = [start_process("worker", f"--dispatcher={target}", *secured, f"--dispatcher_tls_ca={cert}")]
    workers.append(start_process("worker", f"--dispatcher={target}", *secured, f"--dispatcher_tls_ca={cert}"))
    processes = [dispatcher, *(process for process, _, _ in workers)]
    try:
        wait_for_workers(target, 2, ca=cert, token=TOKEN)
        dataset = reader.distributed_dataset(
            uneven_snapshot,
            64,
            num_epochs=2,
            service=reader.ServiceOptions(address=target, auth_token=TOKEN, tls_ca=cert),
        )
        assert ids_of(dataset) == {i: 2 for i in range(2000)}, "the warm epoch opens its first split early, too"

        assert main(["status", f"--dispatcher={target}", f"--tls_ca={cert}", f"--auth_token_file={token_file}"]) == 0
        assert sorted(json.loads(capsys.readouterr().out)["workers"]) == sorted(t for _, t, _ in workers)
        assert main(["status", f"--dispatcher={target}", f"--tls_ca={cert}"]) == 1
        assert "answered UNAUTHENTICATED" in capsys.readouterr().err
        assert main(["status", f"--dispatcher={target}"]) == 2
        assert "serves TLS; pass --tls_ca=" in capsys.readouterr().err

        _, worker_target, worker_health = workers[0]
        with (
            flight.connect(
                worker_target.replace("grpc://", "grpc+tls://"), tls_root_certs=pathlib.Path(cert).read_bytes()
            ) as c,
            pytest.raises(flight.FlightUnauthenticatedError),
        ):
            c.do_get(flight.Ticket(b"{}")).read_all()
        for probe in (dispatcher_health, worker_health):
            assert health(probe, ca=cert) == health_pb2.HealthCheckResponse.SERVING, "health needs no token"
    finally:
        for process in processes:
            process.send_signal(signal.SIGTERM)
        assert [process.wait(timeout=30) for process in processes] == [0, 0, 0], "SIGTERM drains and exits 0"
