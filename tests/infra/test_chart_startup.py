"""The production chart starts. There is no cluster here, so this runs the processes its gateway pod
runs, as `helm template` renders them with the production values: the gateway container's command
with the rendered environment, and beside it the OPA sidecar's `opa run` with the rendered config.

Around them stands what the pod would reach: the Key Vault objects the SecretProviderClass mounts,
written by docs/deploy.md's own step-2 commands to where the CSI driver would put them; a local
Entra stand-in (TLS, and the token endpoint OPA's workload identity signs in at); a local bundle
store that hands the bundle only to that identity, serving one built and signed with the documented
commands; and a real Redis. The pod's filesystem is a temporary directory. What differs from the
pod is in VALUES (chart values, set as docs/deploy.md's step 4 sets them) and POD_DIFFERENCES
(rendered settings that cannot hold here); everything else runs as rendered.
"""

from __future__ import annotations

import json
import re
import secrets
import shlex
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest
import yaml

from devkit.redis import RedisServer
from devkit.server import TENANTGATE, ServeProcess, free_port, gateway_env, tenantgate_serve
from tests.infra.conftest import CHART, KUBERNETES_VERSION, REPO, find_go_binary, run
from tests.utils.issuer import NORTHWIND, WorkloadIdentityIssuer
from tests.utils.opa import BundleServer, OpaServer, read_tarball, start_opa, stop_opa, wait_http
from tests.utils.tls import write_certificates
from tests.utils.tools import missing_tool

DEPLOY_DOC = REPO / "docs" / "deploy.md"
RELEASE = "tenantgate"  # docs/deploy.md's release and namespace
TENANT_ID = "3f1c9a7e-2b4d-4e6f-8a0b-1c2d3e4f5a6b"  # the deployment's Entra tenant
GATEWAY_CLIENT_ID = "7a8b9c0d-1e2f-4a3b-8c4d-5e6f7a8b9c0d"  # the stamp's gateway identity
STORAGE_SCOPE = "https://storage.azure.com/.default"
# Where the workload identity webhook projects the federated token into every container.
WEBHOOK_TOKEN_DIR = "/var/run/secrets/azure/tokens"

# Rendered gateway settings that cannot hold here, and why; each runs with a value of the test's.
POD_DIFFERENCES = {
    "TENANTGATE_HOST": "0.0.0.0: loopback only here",
    "TENANTGATE_METRICS_HOST": "0.0.0.0: loopback only here",
    "TENANTGATE_METRICS_PORT": "a free port (the API's comes from tenantgate_serve's --port)",
    "TENANTGATE_OPA_URL": "the sidecar's loopback API, on a free port",
    "TENANTGATE_REDIS_URL": "the local redis-server, without TLS...",
    "TENANTGATE_REDIS_ENTRA": "...and without Azure Managed Redis's Entra ID sign-in",
    "TENANTGATE_DEVICE": "cuda: no GPU here",
}


def _values(issuer: WorkloadIdentityIssuer, store: BundleServer, public_key: Path) -> list[str]:
    """The production values, with the landing zone's outputs as docs/deploy.md's step 4 sets them."""
    return [
        "--set", f"azure.tenantId={TENANT_ID}",
        "--set", f"azure.gatewayClientId={GATEWAY_CLIENT_ID}",
        "--set", f"gateway.settings.authority={issuer.base_url}",  # the Entra stand-in
        "--set", f"opa.bundle.serviceUrl={store.url}/bundles",  # the bundle container stand-in
        "--set-file", f"opa.bundle.publicKey={public_key}",
        # So a second bundle is fetched within seconds, not the production 60-120 s.
        "--set", "opa.bundle.minDelaySeconds=1",
        "--set", "opa.bundle.maxDelaySeconds=2",
    ]


# -- docs/deploy.md's commands ------------------------------------------------------------------------

def _documented_commands(marker: str) -> list[list[str]]:
    """The commands of docs/deploy.md's shell block that contains marker (continuations joined)."""
    blocks = re.findall(r"^ *```sh\n(.*?)^ *```", DEPLOY_DOC.read_text(encoding="utf-8"), re.M | re.S)
    (block,) = [b for b in blocks if marker in b]
    lines = [line.strip() for line in block.replace("\\\n", " ").splitlines()]
    return [shlex.split(line) for line in lines if line and not line.startswith("#")]


def _run_documented(marker: str, cwd: Path, *bundle_options: str) -> list[list[str]]:
    """Runs the block's openssl and tenantgate commands in cwd (bundle_options added to `policy
    bundle`); returns the others (az, kubectl), which reach Azure and are the caller's to stand in for."""
    cwd.mkdir(parents=True, exist_ok=True)
    others = []
    for argv in _documented_commands(marker):
        if argv[0] == "openssl":
            command = argv
        elif argv[1:3] == ["policy", "test"]:
            continue  # the release gate, which tests/gateway/policy runs (10 s more here)
        elif argv[0] == ".venv/bin/tenantgate":
            command = [TENANTGATE, *argv[1:], *(bundle_options if argv[1:3] == ["policy", "bundle"] else ())]
        else:
            others.append(argv)
            continue
        result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=60, check=False)
        assert result.returncode == 0, f"{shlex.join(argv)}:\n{result.stdout}{result.stderr}"
    return others


def _option(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def _key_vault_secrets(cwd: Path) -> dict[str, str]:
    """What step 2 writes to the stamp's Key Vault: secret name -> value."""
    written = {}
    for argv in _run_documented("audit keygen", cwd):
        if argv[:4] == ["az", "keyvault", "secret", "set"]:
            name = _option(argv, "--name")
            # A --value is `$(openssl rand -base64 48)`: a random value of that size stands for it.
            written[name] = ((cwd / _option(argv, "--file")).read_text() if "--file" in argv
                             else secrets.token_urlsafe(48))
    return written


def _signed_bundle(cwd: Path, *bundle_options: str) -> Path:
    """A key pair as the prerequisites make it, and the bundle step 3 builds and signs with it."""
    _run_documented("openssl ecparam", cwd)
    uploads = _run_documented("policy bundle --out", cwd, *bundle_options)
    (upload,) = [argv for argv in uploads if argv[:3] == ["az", "storage", "blob"]]
    assert f"/{_option(upload, '--container-name')}/{_option(upload, '--name')}" == BundleServer.RESOURCE
    return cwd / _option(upload, "--file")


def _documented_public_key(cwd: Path) -> Path:
    """The file step 4's `helm upgrade --install` passes as the bundle's public key."""
    (name,) = re.findall(r"^ *--set-file opa\.bundle\.publicKey=(\S+) \\$", DEPLOY_DOC.read_text(encoding="utf-8"),
                         re.M)
    return cwd / name


# -- the rendered pod -----------------------------------------------------------------------------------

def _objects(manifest: str) -> list[dict]:
    return [document for document in yaml.safe_load_all(manifest) if document]


def _one(objects: list[dict], kind: str, name: str) -> dict:
    (found,) = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


@dataclass
class PodFiles:
    """The pod's filesystem under root: the containers' volumes as the kubelet, the CSI driver and
    the workload identity webhook would fill them."""

    root: Path
    mounts: tuple[str, ...]
    read_only: tuple[str, ...]

    def path(self, pod_path: str) -> Path:
        return self.root / pod_path.lstrip("/")

    def remap(self, value: str) -> str:
        """A pod path under one of the mounts, as this machine sees it; any other value as it is."""
        return str(self.path(value)) if _under(value, self.mounts) else value

    def assert_present(self, value: str) -> None:
        """A path in a read-only mount must be there: the pod could not create it (here it could)."""
        assert not _under(value, self.read_only) or self.path(value).exists(), f"{value} is not mounted"


def _under(value: str, mounts: tuple[str, ...]) -> bool:
    return any(value == mount or value.startswith(mount.rstrip("/") + "/") for mount in mounts)


def _pod_files(root: Path, objects: list[dict], pod: dict, key_vault: dict[str, str], federated_token: str) -> PodFiles:
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    mounts = [m for c in pod["containers"] for m in c["volumeMounts"]]
    files = PodFiles(root, tuple(sorted({m["mountPath"] for m in mounts} | {WEBHOOK_TOKEN_DIR})),
                     tuple(sorted({m["mountPath"] for m in mounts if m.get("readOnly")} | {WEBHOOK_TOKEN_DIR})))
    for mount in mounts:
        directory, volume = files.path(mount["mountPath"]), volumes[mount["name"]]
        directory.mkdir(parents=True, exist_ok=True)
        if "configMap" in volume:
            for name, text in _one(objects, "ConfigMap", volume["configMap"]["name"])["data"].items():
                (directory / name).write_text(text.replace(WEBHOOK_TOKEN_DIR, str(files.path(WEBHOOK_TOKEN_DIR))))
        elif "csi" in volume:
            for item in _csi_objects(objects, volume):
                assert item["objectName"] in key_vault, (f"the chart mounts {item['objectName']}, "
                                                         "which docs/deploy.md never stores")
                (directory / item.get("objectAlias", item["objectName"])).write_text(key_vault[item["objectName"]])
        else:
            assert set(volume) == {"name", "emptyDir"}, volume
    files.path(WEBHOOK_TOKEN_DIR).mkdir(parents=True)
    (files.path(WEBHOOK_TOKEN_DIR) / "azure-identity-token").write_text(federated_token)
    return files


def _csi_objects(objects: list[dict], volume: dict) -> list[dict]:
    provider = _one(objects, "SecretProviderClass", volume["csi"]["volumeAttributes"]["secretProviderClass"])
    return [yaml.safe_load(item) for item in yaml.safe_load(provider["spec"]["parameters"]["objects"])["array"]]


def _synced_secret(objects: list[dict], pod: dict, key_vault: dict[str, str], ref: dict) -> str:
    """A secretKeyRef's value: the Secret the CSI driver syncs from a SecretProviderClass the pod mounts."""
    for volume in (v for v in pod["volumes"] if "csi" in v):
        provider = _one(objects, "SecretProviderClass", volume["csi"]["volumeAttributes"]["secretProviderClass"])
        for synced in provider["spec"].get("secretObjects", []):
            for item in synced["data"] if synced["secretName"] == ref["name"] else []:
                if item["key"] == ref["key"]:
                    return key_vault[item["objectName"]]
    raise AssertionError(f"no SecretProviderClass of the pod syncs {ref}")


def _rendered_env(objects: list[dict], pod: dict, container: dict, key_vault: dict[str, str]) -> dict[str, str]:
    env = {}
    for item in container["env"]:
        if "value" in item:
            env[item["name"]] = item["value"]
        else:
            assert set(item["valueFrom"]) == {"secretKeyRef"}, item
            env[item["name"]] = _synced_secret(objects, pod, key_vault, item["valueFrom"]["secretKeyRef"])
    return env


def _sidecar_args(container: dict, files: PodFiles, diagnostic: str) -> list[str]:
    """The OPA container's arguments after the API address (start_opa gives `run --server --addr`
    on a free loopback port), with the diagnostic address and the mounted paths of this machine."""
    args = container["args"]
    assert args[:3] == ["run", "--server", "--addr=127.0.0.1:8181"]
    args = [arg.replace("0.0.0.0:8282", diagnostic) for arg in args[3:]]
    return [f"{flag}{equals}{files.remap(value)}" for flag, equals, value in (arg.partition("=") for arg in args)]


# -- the processes ----------------------------------------------------------------------------------

@dataclass
class Pod:
    gateway: ServeProcess
    opa: OpaServer
    opa_health: str
    issuer: WorkloadIdentityIssuer
    store: BundleServer
    env: dict[str, str]

    def chat(self, content: str) -> str:
        token = self.issuer.mint(NORTHWIND, audience=self.env["TENANTGATE_AUDIENCES"])
        with openai.OpenAI(base_url=self.gateway.base_url + "/v1", api_key=token, max_retries=0, timeout=60) as client:
            reply = client.chat.completions.create(model=self.env["TENANTGATE_MODEL"], max_tokens=8,
                                                   messages=[{"role": "user", "content": content}])
        assert reply.choices[0].finish_reason in ("stop", "length")
        return reply.model

    def active_revision(self) -> str:
        bundles = httpx.get(self.opa.url + "/v1/data/system/bundles").json()
        return bundles["result"]["tenantgate"]["manifest"]["revision"]

    def audit_revisions(self) -> list[str]:
        lines = self.gateway.stdout.read_text().splitlines()
        entries = [json.loads(line) for line in lines if line.startswith("{")]
        return [entry["policy_revision"] for entry in entries if entry.get("type") == "record"]


def _tool(name: str, found: str | Path | None, hint: str) -> str:
    if found is None:
        missing_tool(f"{name} not found: {hint}")
    return str(found)


@pytest.fixture(scope="module")
def pod(opa_bin: str, redis_binary: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pod]:
    helm = _tool("helm", find_go_binary("helm"), "run scripts/install-infra-tools.sh (make test does)")
    _tool("openssl", shutil.which("openssl"), "docs/deploy.md's key commands need it (apt-get install openssl)")
    root = tmp_path_factory.mktemp("chart-startup")
    (root / "tls").mkdir()
    ca, certificate, key = write_certificates(root / "tls")
    key_vault = _key_vault_secrets(root / "step-2")
    bundle = _signed_bundle(root / "release")
    federated_token = secrets.token_urlsafe(32)

    with pytest.MonkeyPatch.context() as patch, WorkloadIdentityIssuer(
        tenant_id=TENANT_ID, client_id=GATEWAY_CLIENT_ID, federated_token=federated_token, scope=STORAGE_SCOPE,
        tls=(certificate, key),
    ) as issuer:
        # The test CA stands for the public ones: every process here trusts it (Python's ssl, httpx, Go).
        patch.setenv("SSL_CERT_FILE", str(ca))
        store = BundleServer(root / "store.tar.gz", tls=(certificate, key), bearer=issuer.access_token)
        shutil.copyfile(bundle, store.path)
        redis = RedisServer(redis_binary, root).start()
        opa: OpaServer | None = None
        try:
            values = _values(issuer, store, _documented_public_key(root / "release"))
            rendered = run([helm, "template", RELEASE, CHART, "--namespace", RELEASE, "--kube-version",
                            KUBERNETES_VERSION, *values])
            assert rendered.returncode == 0, rendered.stderr
            objects = _objects(rendered.stdout)
            pod_spec = _one(objects, "Deployment", f"{RELEASE}-gateway")["spec"]["template"]["spec"]
            containers = {container["name"]: container for container in pod_spec["containers"]}
            files = _pod_files(root / "pod", objects, pod_spec, key_vault, federated_token)

            # The sidecar, and its readiness probe: the bundle downloaded with the workload identity,
            # verified and active.
            diagnostic = f"127.0.0.1:{free_port()}"
            opa = start_opa(opa_bin, _sidecar_args(containers["opa"], files, diagnostic), root)
            health = f"http://{diagnostic}/health?bundles"
            assert wait_http(health, timeout=30), f"OPA activated no bundle:\n{opa.log_text()[-3000:]}"

            # The gateway: its rendered command and environment.
            gateway = containers["gateway"]
            env = _rendered_env(objects, pod_spec, gateway, key_vault)
            assert env["TENANTGATE_OPA_URL"] == "http://127.0.0.1:8181", "the sidecar's API address"
            assert env["TENANTGATE_REDIS_ENTRA"] == "true", "the landing zone's Redis takes Entra ID only"
            assert env["TENANTGATE_PORT"] == str(gateway["ports"][0]["containerPort"])
            assert gateway["command"][0] == "tenantgate" and not gateway.get("args")
            here = {"TENANTGATE_HOST": "127.0.0.1", "TENANTGATE_METRICS_HOST": "127.0.0.1",
                    "TENANTGATE_METRICS_PORT": str(free_port()), "TENANTGATE_OPA_URL": opa.url,
                    "TENANTGATE_REDIS_URL": redis.url, "TENANTGATE_REDIS_ENTRA": "false", "TENANTGATE_DEVICE": "cpu"}
            assert set(here) == set(POD_DIFFERENCES) and set(here) <= set(env)
            for value in env.values():
                files.assert_present(value)
            env = {name: files.remap(value) for name, value in env.items()} | here
            with tenantgate_serve(root, gateway_env(**env), command=tuple(gateway["command"][1:])) as serving:
                yield Pod(serving, opa, health, issuer, store, env)
        finally:
            if opa is not None:
                stop_opa(opa)
            redis.stop()
            store.close()


def _ready(pod: Pod) -> bool:
    """/readyz as the chart's probe judges it: kubelet takes a pod out only after 3 failed probes
    in a row (failureThreshold's default), so one probe lost to a loaded machine (a Redis ping over
    REDIS_TIMEOUT_S, as CI once saw) is not the pod going unready. Three tries, a second apart."""
    for attempt in range(3):
        if attempt:
            time.sleep(1)
        if httpx.get(pod.gateway.base_url + "/readyz").status_code == 200:
            return True
    return False


def test_the_production_pod_becomes_ready_and_serves_a_chat(pod: Pod) -> None:
    assert _ready(pod)
    assert pod.chat("What does a gateway do?") == pod.env["TENANTGATE_MODEL"]
    # OPA signed in with the pod's federated token, and fetched the bundle with the token it got.
    assert True in pod.issuer.token_grants and False not in pod.issuer.token_grants
    assert ("GET", BundleServer.RESOURCE, 200) in pod.store.requests
    # And sent it nothing: no decision logs (the inputs), no status reports.
    assert {method for method, _, _ in pod.store.requests} == {"GET"}
    # The request was judged under the signed bundle's policy.
    assert pod.audit_revisions()[-1] == f"opa:tenantgate@{pod.active_revision()}"


def test_a_bundle_signed_with_another_key_is_refused(pod: Pod, tmp_path: Path) -> None:
    revision = pod.active_revision()
    # Another key's bundle, made the documented way, whose data would turn Northwind away.
    data = tmp_path / "data"
    shutil.copytree(REPO / "policies" / "data", data)
    tenants = json.loads((data / "tenants.example.json").read_text())
    tenants["tenants"][NORTHWIND]["enabled"] = False
    (data / "tenants.example.json").write_text(json.dumps(tenants))
    forged = _signed_bundle(tmp_path / "other-key", "--data", str(data))
    assert json.loads(read_tarball(forged)[".manifest"])["revision"] != revision
    served = len(pod.store.requests)
    shutil.copyfile(forged, pod.store.path.with_suffix(".tmp"))
    pod.store.path.with_suffix(".tmp").replace(pod.store.path)

    refused = "Bundle load failed: failed to verify JWT signature"
    deadline = time.monotonic() + 20
    while refused not in pod.opa.log_text() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert refused in pod.opa.log_text(), pod.opa.log_text()[-3000:]
    assert ("GET", BundleServer.RESOURCE, 200) in pod.store.requests[served:], "OPA fetched the forged bundle"
    # OPA keeps the verified bundle active; the gateway stays ready and still serves Northwind.
    assert pod.active_revision() == revision
    assert httpx.get(pod.opa_health).status_code == 200
    assert _ready(pod)
    pod.chat("And after the forged bundle?")
    assert pod.audit_revisions()[-1] == f"opa:tenantgate@{revision}"
