"""deploy/: the Kubernetes manifests against the Kubernetes schemas (offline), the compose file,
the HAProxy config and the Dockerfile, checked for what a rolling restart relies on."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from proxy.config.settings import settings_from_dict
from proxy.server.edge.local_paths import HEALTH_PATHS
from proxy.server.process.lifecycle import ServerOptions
from tests.support.memory_bounds import HELD_BYTES_FACTOR

ROOT = Path(__file__).parents[2]
DEPLOY = ROOT / "deploy"
KUBERNETES = DEPLOY / "kubernetes"
MANIFESTS = sorted(p for p in KUBERNETES.glob("*.yaml") if p.name != "kustomization.yaml")
VERSIONS = ("1.29.0", kubernetes_validate.latest_version())


def documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def kind(name: str) -> dict[str, Any]:
    return next(doc for path in MANIFESTS for doc in documents(path) if doc["kind"] == name)


def flag(args: list[str], name: str) -> float:
    return float(args[args.index(name) + 1])


class TestKubernetesManifests:
    @pytest.mark.parametrize("version", VERSIONS)
    @pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
    def test_each_manifest_is_valid_against_the_kubernetes_schemas(self, path, version):
        for doc in documents(path):
            kubernetes_validate.validate(doc, version, strict=True)

    def test_the_validator_refuses_a_misspelt_field(self):
        deployment = kind("Deployment")
        broken = json.loads(json.dumps(deployment))
        broken["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(broken, VERSIONS[0], strict=True)

    def test_kustomization_lists_every_manifest(self):
        listed = yaml.safe_load((KUBERNETES / "kustomization.yaml").read_text())["resources"]
        assert sorted(listed) == [p.name for p in MANIFESTS]

    def test_probes_use_livez_and_readyz(self):
        container = kind("Deployment")["spec"]["template"]["spec"]["containers"][0]
        assert container["livenessProbe"]["httpGet"]["path"] == "/livez"
        assert container["startupProbe"]["httpGet"]["path"] == "/livez"
        assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
        assert {"/livez", "/readyz"} <= HEALTH_PATHS

    def test_the_termination_grace_period_covers_pre_stop_drain_and_grace(self):
        pod = kind("Deployment")["spec"]["template"]["spec"]
        container = pod["containers"][0]
        pre_stop = float(container["lifecycle"]["preStop"]["exec"]["command"][-1])
        drain, grace = flag(container["args"], "--drain-delay"), flag(container["args"], "--shutdown-grace")
        assert pod["terminationGracePeriodSeconds"] > pre_stop + drain + grace

    def test_the_pod_runs_as_non_root_on_a_read_only_root_filesystem(self):
        pod = kind("Deployment")["spec"]["template"]["spec"]
        container = pod["containers"][0]
        assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["runAsUser"] != 0
        assert container["securityContext"]["readOnlyRootFilesystem"]
        assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]

    def test_a_rolling_update_never_goes_below_the_replica_count(self):
        assert kind("Deployment")["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
        assert kind("PodDisruptionBudget")["spec"]["maxUnavailable"] == 1

    def test_the_config_map_holds_a_config_the_proxy_loads(self):
        text = kind("ConfigMap")["data"]["context-guard.yaml"]
        settings = settings_from_dict(yaml.safe_load(text), "configmap", {"CONTEXT_GUARD_CLIENT_KEY": "k"})
        assert settings.server.client_keys == ("k",) and settings.log.format == "json"

    def test_the_memory_limit_covers_the_documented_bound(self):
        """docs/security.md: idle RSS, plus `HELD_BYTES_FACTOR` times the request bodies the process
        may hold at once (`server.body_memory_bytes`, enforced: past it a body is refused)."""
        text = kind("ConfigMap")["data"]["context-guard.yaml"]
        settings = settings_from_dict(yaml.safe_load(text), "configmap", {"CONTEXT_GUARD_CLIENT_KEY": "k"})
        held_mib = settings.server.body_memory[0] / 2**20
        idle_mib = 160  # docs/deployment.md
        needed_mib = idle_mib + HELD_BYTES_FACTOR * held_mib
        container = kind("Deployment")["spec"]["template"]["spec"]["containers"][0]
        assert container["args"][container["args"].index("--workers") + 1] == "1"  # one budget per worker process
        limit = container["resources"]["limits"]["memory"]
        assert limit.endswith("Mi") and int(limit[:-2]) >= needed_mib

    def test_the_secret_names_every_variable_the_config_reads(self):
        text = kind("ConfigMap")["data"]["context-guard.yaml"]
        secret = kind("Secret")["stringData"]
        assert set(re.findall(r"\$\{(\w+)\}", text)) | {"OPENAI_API_KEY"} == set(secret)


class TestCompose:
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())

    def test_two_guard_replicas_a_load_balancer_and_redis(self):
        assert set(self.compose["services"]) == {"guard-1", "guard-2", "haproxy", "redis"}

    def test_the_load_balancer_checks_readiness_of_every_replica(self):
        config = (DEPLOY / "haproxy.cfg").read_text()
        assert "option httpchk GET /readyz" in config
        assert all(f"server {name} {name}:8080" in config for name in ("guard-1", "guard-2"))

    def test_a_replica_gets_longer_than_its_drain_to_stop(self):
        guard = self.compose["services"]["guard-1"]
        drain = flag(guard["command"], "--drain-delay")
        assert float(guard["stop_grace_period"].rstrip("s")) > drain + ServerOptions().shutdown_grace_seconds
        assert guard["read_only"] is True

    def test_the_replicas_config_loads(self):
        data = yaml.safe_load((DEPLOY / "guard.yaml").read_text())
        env = {"CONTEXT_GUARD_CLIENT_KEY": "cg", "CONTEXT_GUARD_REDIS_URL": "redis://redis:6379/0"}
        settings = settings_from_dict(data, "guard.yaml", env)
        assert settings.upstreams["openai"].api_key_env == "OPENAI_API_KEY" and settings.state.url == env["CONTEXT_GUARD_REDIS_URL"]
        assert settings.server.client_keys == ("cg",)

    @pytest.mark.skipif(shutil.which("haproxy") is None, reason="haproxy is not installed")
    def test_haproxy_accepts_its_config(self):
        result = subprocess.run(["haproxy", "-c", "-f", str(DEPLOY / "haproxy.cfg")], capture_output=True, timeout=30)
        assert result.returncode == 0, result.stderr.decode()


class TestDockerfile:
    text = (ROOT / "Dockerfile").read_text()

    def instruction(self, name: str) -> str:
        return re.findall(rf"^{name} (.+)$", self.text, flags=re.M)[-1]

    def test_arguments_given_to_docker_run_keep_the_entrypoint(self):
        assert json.loads(self.instruction("ENTRYPOINT")) == ["context-guard", "serve"]
        assert "--host" not in json.loads(self.instruction("CMD"))  # HOST comes from the environment instead
        assert "HOST=0.0.0.0" in self.text

    def test_the_health_check_asks_livez_on_the_configured_port(self):
        check = self.text[self.text.index("HEALTHCHECK") :]
        assert "/livez" in check and "PORT" in check
