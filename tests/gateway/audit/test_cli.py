import json
import stat

import pytest

from devkit.server import free_port
from gateway.audit.sinks import RedisStreamSink, RotatingFileSink
from gateway.audit.trail import AuditTrail, load_or_create_signing_key, public_key_pem
from gateway.audit.verify import key_id, load_public_key
from gateway.main import main
from tests.gateway.audit.chains import build_chain, edit, record


@pytest.fixture
def keys(tmp_path):
    assert main(["audit", "keygen", "--out", str(tmp_path / "keys")]) == 0
    private = tmp_path / "keys" / "audit-signing.pem"
    return load_or_create_signing_key(private), str(tmp_path / "keys" / "audit-signing.pub.pem")


def write(path, lines):
    path.write_text("".join(line + "\n" for line in lines))
    return str(path)


def test_keygen_writes_a_private_key_only_its_owner_can_read(tmp_path, capsys):
    assert main(["audit", "keygen", "--out", str(tmp_path / "k")]) == 0
    private, public = tmp_path / "k" / "audit-signing.pem", tmp_path / "k" / "audit-signing.pub.pem"
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    key = load_or_create_signing_key(private)
    assert load_public_key(public.read_bytes()).public_bytes_raw() == key.public_key().public_bytes_raw()
    assert key_id(key.public_key()) in capsys.readouterr().out


def test_keygen_refuses_to_replace_a_key(tmp_path, capsys):
    assert main(["audit", "keygen", "--out", str(tmp_path)]) == 0
    before = (tmp_path / "audit-signing.pem").read_bytes()
    assert main(["audit", "keygen", "--out", str(tmp_path)]) == 2
    assert (tmp_path / "audit-signing.pem").read_bytes() == before
    assert "refusing" in capsys.readouterr().err


def test_load_or_create_reuses_an_existing_key(tmp_path):
    first = load_or_create_signing_key(tmp_path / "k.pem")
    assert public_key_pem(load_or_create_signing_key(tmp_path / "k.pem")) == public_key_pem(first)


def test_a_key_of_another_type_is_refused(tmp_path):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    pem = ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    (tmp_path / "ec.pem").write_bytes(pem)
    with pytest.raises(ValueError, match="Ed25519"):
        load_or_create_signing_key(tmp_path / "ec.pem")


def test_verify_an_intact_file_exits_0(tmp_path, keys, capsys):
    key, public = keys
    log = write(tmp_path / "audit.jsonl", build_chain(key, 120))
    assert main(["audit", "verify", log, "--public-key", public]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == ["ok: 120 records, 2 checkpoints, 1 chain"]


def test_verify_tampering_exits_1_and_names_the_first_problem(tmp_path, keys, capsys):
    key, public = keys
    log = write(tmp_path / "audit.jsonl", edit(build_chain(key, 120), 41, outcome="denied"))
    assert main(["audit", "verify", log, "--public-key", public]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out == ["TAMPERED: 120 records, 2 checkpoints, 1 chain",
                   "first problem: record 41 was altered (chain chain-a)"]
    assert "denied" not in "\n".join(out)


def test_verify_an_unsigned_tail_exits_0_with_a_warning(tmp_path, keys, capsys):
    key, public = keys
    lines = [line for line in build_chain(key, 150) if json.loads(line)["seq"] < 130]
    assert main(["audit", "verify", write(tmp_path / "a", lines), "--public-key", public]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("ok with warnings") and out[1] == "warning: no checkpoint covers records after seq 100"


def test_verify_rotated_files(tmp_path, keys, capsys):
    key, public = keys
    sink = RotatingFileSink(tmp_path / "audit.jsonl", max_bytes=10_000, backup_count=20)
    with AuditTrail([sink], key, checkpoint_every=20) as trail:
        for i in range(200):
            trail.append(record(i))
    assert main(["audit", "verify", "--rotated", str(tmp_path / "audit.jsonl"), "--public-key", public]) == 0
    assert capsys.readouterr().out.startswith("ok: 200 records")
    newest_first = sorted(str(p) for p in tmp_path.glob("audit.jsonl*"))
    assert main(["audit", "verify", *newest_first, "--public-key", public]) == 1


@pytest.mark.parametrize("case", ["missing file", "bad key", "no input", "files and redis", "empty file"])
def test_verify_usage_and_io_errors_exit_2(tmp_path, keys, capsys, case):
    key, public = keys
    log = write(tmp_path / "audit.jsonl", build_chain(key, 3))
    (tmp_path / "bad.pem").write_text("not a key")
    (tmp_path / "empty").write_text("")
    args = {
        "missing file": [str(tmp_path / "nope.jsonl"), "--public-key", public],
        "bad key": [log, "--public-key", str(tmp_path / "bad.pem")],
        "no input": ["--public-key", public],
        "files and redis": [log, "--redis", "redis://127.0.0.1:1/0", "--public-key", public],
        "empty file": [str(tmp_path / "empty"), "--public-key", public],
    }[case]
    assert main(["audit", "verify", *args]) == 2
    assert capsys.readouterr().err.startswith("tenantgate audit:")


def test_verify_the_redis_stream(redis_server, keys, capsys):
    key, public = keys
    client = redis_server.client()
    with AuditTrail([RedisStreamSink(client, stream="audit:cli")], key, checkpoint_every=50) as trail:
        for i in range(100):
            trail.append(record(i))
    args = ["audit", "verify", "--redis", redis_server.url, "--stream", "audit:cli", "--public-key", public]
    assert main(args) == 0
    assert capsys.readouterr().out.startswith("ok: 100 records, 3 checkpoints")  # 50, 101 and the closing one
    client.xdel("audit:cli", client.xrange("audit:cli", count=11)[-1][0])
    assert main(args) == 1
    assert "record 10 is missing (deleted)" in capsys.readouterr().out
    client.close()


def test_verify_an_unreachable_redis_exits_2(keys, capsys):
    _, public = keys
    url = f"redis://:hunter2@127.0.0.1:{free_port()}/0"
    assert main(["audit", "verify", "--redis", url, "--public-key", public]) == 2
    assert "hunter2" not in capsys.readouterr().err
