"""The deploy files in server/ say what meshfast needs: the probes on the routes that answer them,
grace periods past the drain, a shared-memory volume that holds the segment, each compose gateway
joining with a data dir of its own, every placeholder documented, and roles.sql giving the logins
meshfast really uses (checked on a real PostgreSQL)."""

from __future__ import annotations

import asyncio
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from meshfast import cli, supervisor
from meshfast.settings import ENV_DOC, Settings

SERVER = Path(__file__).resolve().parent.parent / "server"
COMPOSE = SERVER / "compose"
K8S = SERVER / "k8s"
KNOWN_ENV = {name for name, _ in ENV_DOC}


def _load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def _k8s() -> dict[str, dict[str, Any]]:
    """Every manifest of the Kustomize base, by kind."""
    docs = [_load(K8S / name) for name in _load(K8S / "kustomization.yaml")["resources"]]
    return {doc["kind"]: doc for doc in docs}


def _compose() -> dict[str, Any]:
    return _load(COMPOSE / "compose.yaml")


def _gateways() -> dict[str, dict[str, Any]]:
    return {name: svc for name, svc in _compose()["services"].items() if name.startswith("gateway-")}


def _gateway_container() -> dict[str, Any]:
    (container,) = [c for c in _k8s()["Deployment"]["spec"]["template"]["spec"]["containers"] if c["name"] == "meshfast"]
    return container


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


@pytest.fixture
def defaults(monkeypatch: pytest.MonkeyPatch) -> Settings:
    """meshfast's settings with none of its variables set."""
    for name in KNOWN_ENV:
        monkeypatch.delenv(name, raising=False)
    return Settings.from_env()


def _stop_needs_s(drain_timeout_s: float) -> float:
    """What SIGTERM may take: the drain, a worker's own shutdown before Granian kills it, then the
    supervisor's final flush (meshfast.supervisor)."""
    return math.ceil(drain_timeout_s + supervisor._WORKER_STOP_MARGIN_S) + supervisor._FINAL_FLUSH_S


def _bytes(quantity: str) -> int:
    """A Kubernetes quantity (128Mi, 2Gi) or a Docker size (128m) in bytes."""
    match = re.fullmatch(r"(\d+)\s*([KMG]i?|[kmg]b?)?", str(quantity))
    assert match, quantity
    unit = (match.group(2) or "").lower().rstrip("b").rstrip("i")
    return int(match.group(1)) * {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[unit]


def _seconds(duration: str) -> float:
    """A Docker duration (90s, 1m30s) in seconds."""
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", duration)
    assert parts and "".join(n + u for n, u in parts) == duration, duration
    return sum(float(n) * {"h": 3600, "m": 60, "s": 1, "ms": 0.001}[u] for n, u in parts)


def _segment_bytes(settings: Settings) -> int:
    """The size of the shared-memory segment serve creates with these settings, measured."""
    from meshfast._core import Segment

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "segment"
        Segment.create(str(path), slots=settings.shm_slots, ring_records=settings.telemetry_ring_rows)
        return path.stat().st_size


# --- every file ----------------------------------------------------------------------------


def test_every_deploy_yaml_parses() -> None:
    """Every YAML file under server/ is well-formed YAML (one document each)."""
    files = sorted(SERVER.rglob("*.yaml"))
    assert len(files) >= 7
    for path in files:
        docs = list(yaml.safe_load_all(path.read_text()))
        assert len(docs) == 1 and isinstance(docs[0], dict), path


def test_every_variable_the_deploy_files_set_is_one_meshfast_reads() -> None:
    """No misspelt setting: each MESHFAST_* or DATABASE_URL the files set is in meshfast --help."""
    names: set[str] = set()
    for svc in _compose()["services"].values():
        if "meshfast" in svc["image"].lower():  # not postgres's (initdb.sh's passwords)
            names |= set(svc.get("environment", {}))
    for kind in ("Deployment", "Job"):
        for container in _k8s()[kind]["spec"]["template"]["spec"]["containers"]:
            names |= set(_env(container))
    names |= set(_k8s()["Secret"]["stringData"]) - {"secrets.json"}
    ours = {n for n in names if n.startswith("MESHFAST_") or n == "DATABASE_URL"}
    assert ours and ours <= KNOWN_ENV, ours - KNOWN_ENV


def test_every_meshfast_command_parses(capsys: pytest.CaptureFixture[str]) -> None:
    """The commands the files run are ones the CLI accepts."""
    commands = [_gateway_container()["command"] + _gateway_container()["args"]]
    commands += [c["command"] + c.get("args", []) for c in _k8s()["Job"]["spec"]["template"]["spec"]["containers"]]
    commands += [svc["command"] for svc in _compose()["services"].values() if "command" in svc]
    commands += [shlex.split(line.split("ExecStart=", 1)[1])
                 for line in (SERVER / "meshfast.service").read_text().splitlines() if line.startswith("ExecStart=")]
    meshfast = [argv[1:] for argv in commands if Path(argv[0]).name == "meshfast"]
    assert len(meshfast) >= 6
    try:
        cli.build_parser().parse_args(["serve", "--join"])
    except SystemExit:
        pytest.skip("`meshfast serve --join` is not in this build yet (issue 15, the cluster)")
    for argv in meshfast:
        cli.build_parser().parse_args(argv)


# --- Kubernetes ----------------------------------------------------------------------------


def test_kustomization_lists_every_manifest_and_none_names_a_namespace() -> None:
    """The base is namespace-agnostic and complete: every YAML file here is one of its resources."""
    kustomization = _load(K8S / "kustomization.yaml")
    on_disk = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == on_disk
    assert "namespace" not in kustomization
    for name in on_disk:
        assert "namespace" not in _load(K8S / name)["metadata"], name
    assert set(_k8s()) == {"Deployment", "Service", "PodDisruptionBudget", "Secret", "Job"}


def test_deployment_probes_health_and_readiness_on_their_routes() -> None:
    """Liveness and startup on /healthz, readiness on /readyz, all on the port serve listens on."""
    deployment = _k8s()["Deployment"]
    assert deployment["spec"]["replicas"] == 3
    container = _gateway_container()
    argv = container["args"]
    assert argv[0] == "serve" and "--join" in argv and _flag(argv, "--host") == "0.0.0.0"
    (port,) = container["ports"]
    assert port["containerPort"] == int(_flag(argv, "--port"))
    for probe, path in (("livenessProbe", "/healthz"), ("startupProbe", "/healthz"), ("readinessProbe", "/readyz")):
        get = container[probe]["httpGet"]
        assert get["path"] == path, probe
        assert get["port"] in (port["name"], port["containerPort"]), probe
    service = _k8s()["Service"]
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert service["spec"]["ports"][0]["targetPort"] in (port["name"], port["containerPort"])


def test_grace_period_outlasts_the_prestop_sleep_and_the_drain(defaults: Settings) -> None:
    """SIGTERM comes after the preStop sleep, and the pod is not killed before meshfast's drain and
    final flush can end."""
    spec = _k8s()["Deployment"]["spec"]["template"]["spec"]
    container = _gateway_container()
    sleep = container["lifecycle"]["preStop"]["exec"]["command"]
    assert sleep[0] == "sleep" and float(sleep[1]) >= 5
    # The manifest's own value, and meshfast's default should it be dropped.
    drain_s = max(float(_env(container).get("MESHFAST_DRAIN_TIMEOUT_S") or 0), defaults.drain_timeout_s)
    assert spec["terminationGracePeriodSeconds"] > float(sleep[1]) + _stop_needs_s(drain_s)


def test_pdb_keeps_all_but_one_instance_up() -> None:
    """The PodDisruptionBudget covers the Deployment's pods and lets one go at a time."""
    pdb = _k8s()["PodDisruptionBudget"]["spec"]
    deployment = _k8s()["Deployment"]["spec"]
    assert pdb["selector"]["matchLabels"] == deployment["selector"]["matchLabels"]
    assert pdb.get("maxUnavailable") == 1 or pdb.get("minAvailable") == deployment["replicas"] - 1
    assert deployment["strategy"]["rollingUpdate"]["maxUnavailable"] == 0


def test_pods_run_unprivileged_on_a_read_only_root() -> None:
    """Non-root, read-only root filesystem; the data dir, /tmp and /dev/shm are emptyDirs, /dev/shm
    in memory; the secrets file is copied from the Secret into the data dir before serve starts."""
    for kind in ("Deployment", "Job"):
        spec = _k8s()[kind]["spec"]["template"]["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] != 0
        volumes = {v["name"]: v for v in spec["volumes"]}
        for container in spec["initContainers"] + spec["containers"]:
            assert container["securityContext"]["readOnlyRootFilesystem"] is True, (kind, container["name"])
            assert container["securityContext"]["allowPrivilegeEscalation"] is False
            assert "limits" in container["resources"] and "requests" in container["resources"]
            for mount in container["volumeMounts"]:
                assert "emptyDir" in volumes[mount["name"]] or mount.get("readOnly") is True, mount
        (init,) = spec["initContainers"]
        main = spec["containers"][0]
        data_dir = _env(main)["MESHFAST_DATA_DIR"]
        data_mount = next(m for m in main["volumeMounts"] if data_dir.startswith(m["mountPath"] + "/"))
        assert data_mount["mountPath"] != data_dir  # meshfast must own (and chmod) its data dir
        assert f"{data_dir}/secrets.json" in init["command"][-1]
        assert any(m["mountPath"] == data_mount["mountPath"] for m in init["volumeMounts"])
    spec = _k8s()["Deployment"]["spec"]["template"]["spec"]
    shm = next(m for m in _gateway_container()["volumeMounts"] if m["mountPath"] == "/dev/shm")
    assert {v["name"]: v for v in spec["volumes"]}[shm["name"]]["emptyDir"]["medium"] == "Memory"


def test_shared_memory_volumes_hold_two_segments(defaults: Settings) -> None:
    """/dev/shm holds the segment serve creates at the default MESHFAST_SHM_SLOTS twice (a restart
    after a kill builds the new one beside the old), in Kubernetes and in compose, and the memory
    limit counts it beside the workers' ceiling."""
    segment = _segment_bytes(defaults)
    assert segment > 32 << 20
    container = _gateway_container()
    env = _env(container)
    spec = _k8s()["Deployment"]["spec"]["template"]["spec"]
    shm = next(m for m in container["volumeMounts"] if m["mountPath"] == "/dev/shm")
    volume = {v["name"]: v for v in spec["volumes"]}[shm["name"]]
    assert env.get("MESHFAST_SHM_DIR", "/dev/shm") == "/dev/shm" and "MESHFAST_SHM_SLOTS" not in env
    assert _bytes(volume["emptyDir"]["sizeLimit"]) >= 2 * segment
    workers = int(_flag(container["args"], "--workers"))
    ceiling_mb = int(env.get("MESHFAST_MEMORY_CEILING_MB") or defaults.memory_ceiling_bytes >> 20)
    assert _bytes(container["resources"]["limits"]["memory"]) > workers * (ceiling_mb << 20) + 2 * segment
    for name, svc in _gateways().items():
        assert _bytes(svc["shm_size"]) >= 2 * segment, name


def test_secret_holds_every_key_the_pods_read() -> None:
    """Every secretKeyRef and Secret volume item names a key of the Secret, which is marked as
    placeholders."""
    secret = _k8s()["Secret"]
    keys = set(secret["stringData"])
    for kind in ("Deployment", "Job"):
        spec = _k8s()[kind]["spec"]["template"]["spec"]
        for container in spec["containers"]:
            for var in container.get("env", []):
                ref = var.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    assert ref["name"] == secret["metadata"]["name"] and ref["key"] in keys, ref
        for volume in spec["volumes"]:
            if "secret" in volume:
                assert volume["secret"]["secretName"] == secret["metadata"]["name"]
                assert {item["key"] for item in volume["secret"]["items"]} <= keys
    assert {"DATABASE_URL", "MESHFAST_GATEWAY_DATABASE_URL", "secrets.json"} <= keys
    assert all("CHANGE_ME_" in value for value in secret["stringData"].values())


def test_every_kubernetes_placeholder_is_documented() -> None:
    """Each CHANGE_ME_* value and the image placeholder are explained in server/k8s/README.md."""
    readme = (K8S / "README.md").read_text()
    text = "".join(p.read_text() for p in K8S.glob("*.yaml"))
    placeholders = set(re.findall(r"CHANGE_ME_[A-Z_]+", text))
    assert placeholders
    for placeholder in placeholders:
        assert f"`{placeholder}`" in readme, placeholder
    images = {entry["name"]: entry for entry in _load(K8S / "kustomization.yaml")["images"]}
    for kind in ("Deployment", "Job"):
        spec = _k8s()[kind]["spec"]["template"]["spec"]
        for container in spec["initContainers"] + spec["containers"]:
            assert container["image"] in images, container["image"]
    for entry in images.values():
        assert entry["newName"] in readme and str(entry["newTag"]) in readme


# --- Docker Compose ------------------------------------------------------------------------


def test_compose_gateways_join_each_with_its_own_data_dir() -> None:
    """Three gateways run `serve --join` after the one-shot migrate, each on a named volume of
    its own as its data dir, all with the one secrets.json mounted read-only into it."""
    compose = _compose()
    gateways = _gateways()
    assert len(gateways) == 3
    migrate = compose["services"]["migrate"]
    assert migrate["command"] == ["meshfast", "migrate"]
    data_volumes = set()
    secrets_sources = set()
    for name, svc in gateways.items():
        argv = svc["command"]
        assert argv[:3] == ["meshfast", "serve", "--join"], name
        assert _flag(argv, "--host") == "0.0.0.0" and int(_flag(argv, "--workers")) >= 1
        env = svc["environment"]
        data_dir = env["MESHFAST_DATA_DIR"]
        assert env["DATABASE_URL"].startswith("postgresql://meshfast_app:")
        assert env["MESHFAST_GATEWAY_DATABASE_URL"].startswith("postgresql://meshfast_gw:")
        assert "@postgres:5432/meshfast" in env["MESHFAST_GATEWAY_DATABASE_URL"]
        (data,) = [v for v in svc["volumes"] if isinstance(v, str) and v.endswith(f":{data_dir}")]
        data_volumes.add(data.split(":")[0])
        (secrets,) = [v for v in svc["volumes"] if isinstance(v, dict)]
        assert secrets["type"] == "bind" and secrets["read_only"] is True
        assert secrets["target"] == f"{data_dir}/secrets.json"
        secrets_sources.add(secrets["source"])
        assert svc["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
        assert svc["read_only"] is True
        assert "/healthz" in " ".join(svc["healthcheck"]["test"])
    assert len(data_volumes) == 3 and data_volumes <= set(compose["volumes"])
    assert len(secrets_sources) == 1 and migrate["volumes"][0]["source"] in secrets_sources
    postgres = compose["services"]["postgres"]
    assert postgres["image"].startswith("postgres:") and "pg_isready" in postgres["healthcheck"]["test"]
    assert migrate["depends_on"]["postgres"]["condition"] == "service_healthy"


def test_compose_gateways_get_time_to_drain(defaults: Settings) -> None:
    """Docker waits out the drain and the final flush before it kills a gateway (and so does the
    systemd unit)."""
    for name, svc in _gateways().items():
        drain_s = float(svc["environment"].get("MESHFAST_DRAIN_TIMEOUT_S") or defaults.drain_timeout_s)
        assert _seconds(svc["stop_grace_period"]) > _stop_needs_s(drain_s), name
    unit = (SERVER / "meshfast.service").read_text()
    timeout = re.search(r"^TimeoutStopSec=(\d+)$", unit, re.M)
    assert timeout and int(timeout.group(1)) > _stop_needs_s(defaults.drain_timeout_s)


def test_balancer_checks_readiness_of_every_gateway() -> None:
    """HAProxy's servers are exactly the compose gateways on their port, checked on /readyz, with
    /healthz as the fallback when none is ready."""
    config = (COMPOSE / "haproxy.cfg").read_text()
    backends: dict[str, list[str]] = {}
    current = None
    for line in config.splitlines():
        words = line.split()
        if words and not line.startswith(" "):
            current = words[1] if words[0] == "backend" else None
            if current:
                backends[current] = []
        elif current:
            backends[current].append(line.strip())
    ports = {int(_flag(svc["command"], "--port")) for svc in _gateways().values()}
    expected = {f"{name}:{port}" for name in _gateways() for port in ports}
    for backend, uri in (("ready", "/readyz"), ("live", "/healthz")):
        lines = backends[backend]
        assert {line.split()[2] for line in lines if line.startswith("server ")} == expected
        assert f"http-check send meth GET uri {uri}" in lines
    assert "use_backend ready if { nbsrv(ready) gt 0 }" in config and "default_backend live" in config
    lb = _compose()["services"]["lb"]
    bind = re.search(r"^\s*bind :(\d+)$", config, re.M)
    assert bind and lb["ports"][0].endswith(f":{bind.group(1)}")


def test_every_compose_variable_and_image_is_documented() -> None:
    """Each ${VARIABLE} of compose.yaml is explained in server/compose/README.md, required ones fail
    loudly when unset, and the images are the documented meshfast one or pinned official ones."""
    text = (COMPOSE / "compose.yaml").read_text()
    readme = (COMPOSE / "README.md").read_text()
    variables = dict(re.findall(r"\$\{(\w+)(:[?-][^}]*)?\}", text))
    assert variables
    for name, default in variables.items():
        assert f"`{name}`" in readme, name
        assert default.startswith((":?", ":-")), name
    for name, svc in _compose()["services"].items():
        image = svc["image"]
        if "MESHFAST_IMAGE" in image:
            assert "meshfast:local" in image and "meshfast:local" in readme
            assert svc["build"]["dockerfile"] == "server/Dockerfile"
            assert (COMPOSE / svc["build"]["context"] / svc["build"]["dockerfile"]).resolve() == SERVER / "Dockerfile"
        else:
            assert re.fullmatch(r"[a-z]+:\d+(\.\d+)*", image), (name, image)


# --- roles.sql on a real PostgreSQL --------------------------------------------------------


@pytest.fixture
def postgres() -> Iterator[tuple[str, Path]]:
    """A fresh PostgreSQL (pgserver: superuser `postgres`, trust over a Unix socket in ``pg``)."""
    from meshfast.store.database import EmbeddedPostgres

    root = Path(tempfile.mkdtemp(prefix="mf-roles-"))
    server = EmbeddedPostgres(root / "pg")
    try:
        yield server.start(), root
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


def test_roles_sql_gives_the_logins_meshfast_uses(postgres: tuple[str, Path]) -> None:
    """After roles.sql (twice: it is idempotent), meshfast migrates as meshfast_app and serves with
    the gateway role on meshfast_gw, no superuser involved; meshfast_gw cannot act as the admin
    role. (pgserver trusts its socket, so the passwords themselves are not checked here.)"""
    import asyncpg
    from conftest import Gateway
    from pgserver._commands import POSTGRES_BIN_PATH

    superuser_url, root = postgres
    for _ in range(2):
        subprocess.run([str(POSTGRES_BIN_PATH / "psql"), "-X", "-q", "-v", "app_password=app-secret",
                        "-v", "gw_password=gw-secret", "-f", str(SERVER / "roles.sql"), superuser_url],
                       check=True, capture_output=True, timeout=60)
    socket_dir = root / "pg"
    app_url = f"postgresql://meshfast_app:app-secret@/meshfast?host={socket_dir}"
    gw_url = f"postgresql://meshfast_gw:gw-secret@/meshfast?host={socket_dir}"

    env = {k: v for k, v in os.environ.items() if k not in KNOWN_ENV}
    migrate = subprocess.run([sys.executable, "-m", "meshfast.cli", "migrate"],
                             env={**env, "MESHFAST_DATA_DIR": str(root / "migrate"), "DATABASE_URL": app_url},
                             capture_output=True, text=True, timeout=120)
    assert migrate.returncode == 0, migrate.stderr
    gateway = Gateway(root / "data", workers=1,
                      env={"DATABASE_URL": app_url, "MESHFAST_GATEWAY_DATABASE_URL": gw_url}).start()
    try:
        users = gateway.client.get("/admin/users", headers={"authorization": f"Bearer {gateway.admin_token}"})
        assert users.status_code == 200, users.text
    finally:
        gateway.stop()

    async def check() -> None:
        conn = await asyncpg.connect(superuser_url.replace("/postgres?", "/meshfast?"))
        try:
            assert await conn.fetchval("SELECT tableowner FROM pg_tables WHERE tablename = 'request_logs'") == "meshfast_app"
            assert not await conn.fetchval("SELECT rolsuper OR rolcreaterole FROM pg_roles WHERE rolname = 'meshfast_app'")
        finally:
            await conn.close()
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await asyncpg.connect(gw_url, server_settings={"role": "meshfast_admin"})
        gw = await asyncpg.connect(gw_url, server_settings={"role": "meshfast_gateway"})
        await gw.close()

    asyncio.run(check())


# --- systemd -------------------------------------------------------------------------------


def _unit() -> dict[str, list[str]]:
    """The unit's [Service] settings (each key's values, in order)."""
    section, out = "", {}
    for line in (SERVER / "meshfast.service").read_text().splitlines():
        line = line.strip()
        if line.startswith("["):
            section = line
        elif section == "[Service]" and line and not line.startswith("#"):
            key, value = line.split("=", 1)
            out.setdefault(key, []).append(value)
    return out


def test_the_systemd_unit_is_hardened_and_keeps_what_meshfast_needs(defaults: Settings) -> None:
    """No privileges, a read-only system, private devices and tmp, a syscall filter; writable only
    where meshfast writes (its data dir and its segment's directory, preserved across restarts so
    a killed run's request rows reach the database), and stopped no sooner than the drain ends."""
    unit = _unit()
    for key, value in {"NoNewPrivileges": "yes", "ProtectSystem": "strict", "ProtectHome": "yes",
                       "PrivateTmp": "yes", "PrivateDevices": "yes", "RestrictSUIDSGID": "yes",
                       "CapabilityBoundingSet": "", "SystemCallArchitectures": "native", "UMask": "0077",
                       "RuntimeDirectoryPreserve": "yes"}.items():
        assert unit.get(key) == [value], (key, unit.get(key))
    assert unit["SystemCallFilter"] == ["@system-service"]
    env = dict(v.split("=", 1) for v in unit["Environment"])
    writable = unit["ReadWritePaths"][0].split()
    assert env["MESHFAST_DATA_DIR"] in writable and env["MESHFAST_SHM_DIR"] in writable
    assert env["MESHFAST_SHM_DIR"] == "/run/" + unit["RuntimeDirectory"][0]
    assert env["MESHFAST_DATA_DIR"] == "/var/lib/" + unit["StateDirectory"][0]
    assert set(env) <= KNOWN_ENV
    assert float(unit["TimeoutStopSec"][0]) > _stop_needs_s(defaults.drain_timeout_s)
    assert set(unit["RestrictAddressFamilies"][0].split()) == {"AF_UNIX", "AF_INET", "AF_INET6"}


def test_the_systemd_unit_verifies(tmp_path: Path) -> None:
    """`systemd-analyze verify` accepts every directive (with ExecStart pointed at this build)."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    meshfast = Path(sys.executable).with_name("meshfast")
    text = (SERVER / "meshfast.service").read_text()
    text = re.sub(r"^ExecStart=\S+", f"ExecStart={meshfast}", text, flags=re.M)
    unit = tmp_path / "meshfast.service"
    unit.write_text(text)
    run = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60)
    problems = [line for line in (run.stdout + run.stderr).splitlines()
                if "meshfast.service" in line and "is not executable" not in line]
    assert run.returncode == 0 and not problems, run.stdout + run.stderr


def test_the_image_builds_the_wheel_apart_and_runs_unprivileged_with_its_data_dir_a_volume() -> None:
    lines = [line.strip() for line in (SERVER / "Dockerfile").read_text().splitlines()
             if line.strip() and not line.strip().startswith("#")]
    stages = [line for line in lines if line.startswith("FROM ")]
    assert len(stages) == 2 and " AS build" in stages[0] and "slim" in stages[1]
    final = lines[lines.index(stages[1]):]
    user = next(line.split()[1] for line in final if line.startswith("USER "))
    assert user.split(":")[0].isdigit() and int(user.split(":")[0]) >= 1000
    env = " ".join(line for line in final if line.startswith("ENV") or line.startswith("MESHFAST_"))
    data_dir = re.search(r"MESHFAST_DATA_DIR=(\S+)", " ".join(final)).group(1)  # type: ignore[union-attr]
    assert env and data_dir
    volume = next(line for line in final if line.startswith("VOLUME"))
    assert data_dir in volume
    cmd = next(line for line in final if line.startswith("CMD"))
    assert '"meshfast", "serve"' in cmd
