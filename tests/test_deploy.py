"""deploy/ checked against the real `attnserve serve`, and its checks shown able to fail.

Every YAML file under deploy/ parses; each kustomize variant (base, base+tls, base+auth, the
overlays), the monitoring files and the KServe example pass deploy/check_manifests.py, which
holds flags, ports, probes, grace periods and scaling against `attnserve serve`'s own parser,
ServerConfig, the health service names and the metric names; its kustomize renderer agrees with
`kubectl kustomize` where kubectl is installed. The Dockerfile's entry point, user and ports are
checked too, and the exec health probe runs against real health servers (plaintext, TLS, mTLS).
Then each broken manifest, one RFC 6902 operation away from a good one, must fail as named.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import socket
import subprocess
from concurrent import futures
from pathlib import Path

import grpc
import pytest
import yaml
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from attnserve.server.app import SERVICE

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
_spec = importlib.util.spec_from_file_location("check_manifests", DEPLOY / "check_manifests.py")
checks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(checks)
load, render, one, json_patch = checks.load, checks.render, checks.one, checks.json_patch


def monitoring_docs() -> list[dict]:
    return render(DEPLOY / "base") + [d for p in sorted((DEPLOY / "monitoring").glob("*.yaml")) for d in load(p)]


def kserve_docs() -> list[dict]:
    return [d for p in sorted((DEPLOY / "kserve").glob("*.yaml")) for d in load(p)]


OVERLAYS = [f"overlays/{d.name}" for d in sorted((DEPLOY / "overlays").iterdir())]
VARIANTS = {"base": ("base", ()), "base+tls": ("base", ("tls",)), "base+auth": ("base", ("auth",))}
VARIANTS |= {"base+tracing": ("base", ("tracing",))}
VARIANTS |= {overlay: (overlay, ()) for overlay in OVERLAYS}


# ---- tests -----------------------------------------------------------------------------------
def test_every_yaml_file_parses_into_objects_or_a_json_patch():
    files = sorted(DEPLOY.rglob("*.yaml"))
    assert len(files) >= 12, files
    for path in files:
        for doc in load(path):
            if isinstance(doc, list):
                assert all({"op", "path"} <= op.keys() for op in doc), path
            else:
                assert {"apiVersion", "kind"} <= doc.keys(), path
                assert doc["kind"] in ("Kustomization", "Component") or doc["metadata"]["name"], path


@pytest.mark.parametrize("variant", VARIANTS)
def test_kustomize_variant_runs_attnserve_serve_as_the_server_takes_it(variant):
    failures = checks.check_variant(render(DEPLOY / VARIANTS[variant][0], VARIANTS[variant][1]))
    assert not failures, "\n".join(failures)


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed: the renderer is not compared")
@pytest.mark.parametrize("directory", ["base", *OVERLAYS])
def test_renderer_matches_kubectl_kustomize(directory):
    out = subprocess.run(["kubectl", "kustomize", str(DEPLOY / directory)], capture_output=True, text=True, check=True)
    key = lambda d: (d["kind"], d["metadata"]["name"])
    assert sorted(yaml.safe_load_all(out.stdout), key=key) == sorted(render(DEPLOY / directory), key=key)


def test_monitoring_scrapes_the_metrics_port_and_serves_the_hpa_metric():
    failures = checks.check_variant(monitoring_docs())
    assert not failures, "\n".join(failures)


def test_kserve_runtime_serves_the_open_inference_protocol_on_the_grpc_port():
    failures = checks.check_kserve(kserve_docs())
    assert not failures, "\n".join(failures)


def test_dockerfile_runs_attnserve_serve_as_a_numeric_non_root_user_on_the_deployed_ports():
    steps, pod = checks.dockerfile(), one(render(DEPLOY / "base"), "Deployment")["spec"]["template"]["spec"]
    entrypoint = json.loads(steps["ENTRYPOINT"][-1])
    assert entrypoint[:2] == ["attnserve", "serve"] and checks.MODEL_ROOTS, (entrypoint, steps["COPY"])
    config, failures = checks.parse_serve([*entrypoint[2:], f"--model={checks.MODEL_ROOTS[0]}/small"])
    assert config is not None and config.host == "0.0.0.0" and not failures, failures
    user = steps["USER"][-1].split(":")[0]
    assert user.isdigit() and int(user) != 0 and pod["securityContext"]["runAsUser"] == int(user), user
    exposed = {int(port.split("/")[0]) for line in steps["EXPOSE"] for port in line.split()}
    assert {p["containerPort"] for p in pod["containers"][0]["ports"]} <= exposed, exposed
    copied = [c.split(" ", 1)[-1] for c in steps["COPY"]]  # past --chmod=755
    assert f"deploy/health_probe.py /usr/local/bin/{checks.PROBE_COMMAND}" in copied, copied


def test_the_serving_image_extra_installs_no_torch():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((DEPLOY.parent / "pyproject.toml").read_text())["project"]
    extra = next(arg.split("=", 1)[1] for arg in checks.dockerfile()["ARG"] if arg.startswith("EXTRA="))
    assert extra in project["optional-dependencies"], f"pyproject.toml has no [{extra}] extra for deploy/Dockerfile"
    requirements = project["dependencies"] + project["optional-dependencies"][extra]
    assert not [r for r in requirements if re.match(r"torch\b", r)], requirements


def test_check_manifests_command_passes_deploy_and_prints_what_fails(tmp_path, capsys):
    assert checks.main([str(DEPLOY / "overlays" / "tls-auth"), str(DEPLOY / "monitoring")]) == 0
    assert checks.main([str(DEPLOY / "kserve")]) == 0
    broken = render(DEPLOY / "base")
    json_patch(one(broken, "Deployment"), {"op": "add", "path": f"{SHORTHANDS['$args']}/-", "value": "--drain=5"})
    (tmp_path / "broken.yaml").write_text(yaml.safe_dump_all(broken))
    assert checks.main([str(tmp_path)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[2] == f"{tmp_path}: 1 failed" and out[3].startswith("  - --drain is not a flag of"), out


@pytest.fixture(scope="module", params=["plaintext", "tls", "mtls"])
def health_target(request, pki):
    """A real grpc.health.v1 server ("" SERVING, attnserve.v1 NOT_SERVING): the probe's flags to reach
    it, and flags that cannot (a closed port; no CA; no client certificate)."""
    folder, files = pki
    server, servicer = grpc.server(futures.ThreadPoolExecutor(max_workers=2)), health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    servicer.set(SERVICE, health_pb2.HealthCheckResponse.NOT_SERVING)
    mutual = request.param == "mtls"
    if request.param == "plaintext":
        port = server.add_insecure_port("127.0.0.1:0")
    else:
        keys = [(files["server.key"], files["server.crt"])]
        credentials = grpc.ssl_server_credentials(keys, files["ca"] if mutual else None, require_client_auth=mutual)
        port = server.add_secure_port("127.0.0.1:0", credentials)
    server.start()
    flags = [f"--port={port}", "--timeout=2"]
    if request.param == "plaintext":
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            yield flags, [f"--port={s.getsockname()[1]}", "--timeout=2"]
    else:
        flags.append(f"--tls-ca={folder / 'ca'}")
        client = [f"--tls-cert={folder / 'client.crt'}", f"--tls-key={folder / 'client.key'}"]
        yield (flags + client, flags) if mutual else (flags, flags[:-1])
    server.stop(None)


def test_health_probe_exits_zero_only_for_serving(health_target, capsys):
    flags, unable = health_target
    assert checks.health_probe.main([*flags, "--service="]) == 0
    assert checks.health_probe.main([*flags, f"--service={SERVICE}"]) == 1
    assert checks.health_probe.main([*flags, "--service=nope"]) == 1
    assert capsys.readouterr().out.splitlines()[:2] == ["server: SERVING", f"{SERVICE}: NOT_SERVING"]
    assert checks.health_probe.main([*unable, "--service="]) == 1


@pytest.mark.parametrize("name", ["--tls-server-name", "--server-name"])
def test_health_probe_names_the_certificates_name_as_the_clients_do(name):
    """--tls-server-name, as generate and bench spell it; --server-name, its first name, still works."""
    assert checks.health_probe.build_parser().parse_args(["--port=1", f"{name}=attnserve"]).server_name == "attnserve"


# One thing broken in a good variant, by an RFC 6902 operation; each must fail with the text given.
# $args, $c, $pod and $model stand for the server container's args, the container, the pod spec and
# the InferenceService's model; HPA, PDB and ISVC for their kinds.
BREAKAGES = yaml.safe_load(r"""
unknown flag:          [base, Deployment, add, $args/-, --no-such-flag=1, --no-such-flag is not a flag]
abbreviated flag:      [base, Deployment, add, $args/-, --drain=5, --drain is not a flag]
bad value:             [base, Deployment, add, $args/-, --max-batch=zero, "argument --max-batch: 'zero'"]
half of a pair:        [base, Deployment, add, $args/-, --tls-cert=/tmp/c, --tls-cert and --tls-key go together]
loopback host:         [base, Deployment, add, $args/-, --host=127.0.0.1, --host 127.0.0.1]
threads of the node:   [base, Deployment, add, $args/-, --threads=0, --threads 0 on 4.0 cores]
arena over the limit:  [base, Deployment, add, $args/-, --kv-cache-memory=4Gi, does not fit the memory limit]
prefix cache over it:  [base, Deployment, add, $args/-, --prefix-cache-memory=1500Mi, do not fit the memory limit]
token not mounted:     [base, Deployment, add, $args/-, --auth-token-file=/etc/t, --auth-token-file /etc/t is in no]
mTLS, probe has none:  [base+tls, Deployment, add, $args/-, --tls-client-ca=/etc/attnserve/tls/ca.crt, wants client]
port mismatch:         [base, Deployment, replace, $c/ports/0/containerPort, 50052, containerPorts]
HTTP port mismatch:    [base, Deployment, replace, $c/ports/2/containerPort, 8001, containerPorts]
Service HTTP elsewhere: [base, Service, replace, /spec/ports/1/port, 8080, "pods' --http-port 8000"]
probe, metrics port:   [base, Deployment, replace, $c/readinessProbe/grpc/port, 9100, readinessProbe probes port 9100]
probe, no such health: [base, Deployment, replace, $c/livenessProbe/grpc/service, x.Y, "about 'x.Y'"]
gRPC probe over TLS:   [base+tls, Deployment, replace, $c/livenessProbe, {grpc: {port: 50051}}, speak plaintext]
startup too short:     [base, Deployment, replace, $c/startupProbe/failureThreshold, 10, warm-up may take]
grace too short:       [base, Deployment, replace, $pod/terminationGracePeriodSeconds, 30, terminationGrace]
no preStop:            [base, Deployment, remove, $c/lifecycle, null, "preStop {}"]
replicas beside HPA:   [base, Deployment, add, /spec/replicas, 3, undo the HPA]
virtual IP:            [base, Service, remove, /spec/clusterIP, null, headless]
Service elsewhere:     [base, Service, replace, /spec/selector/app.kubernetes.io~1name, x, Service selector]
PDB elsewhere:         [base, PDB, add, /spec/selector/matchLabels/tier, x, PDB selector]
HPA on another:        [base, HPA, replace, /spec/scaleTargetRef/name, x, scaleTargetRef]
HPA metric unserved:   [base, HPA, replace, /spec/metrics/0/pods/metric/name, q, HPA metric q]
HPA target too high:   [base, HPA, replace, /spec/metrics/0/pods/target/averageValue, "64", below]
HPA without CPU:       [base, HPA, remove, /spec/metrics/1, null, cpu (the fallback)]
scrape, wrong port:    [monitoring, PodMonitor, replace, /spec/podMetricsEndpoints/0/port, grpc, not --metrics-port]
adapter, other name:   [monitoring, HPA, replace, /spec/metrics/0/pods/metric/name, attnserve_batch_size, the HPA wants]
KServe REST protocol:  [kserve, ISVC, replace, $model/protocolVersion, v2, gRPC only]
KServe port not h2c:   [kserve, ServingRuntime, replace, /spec/containers/0/ports/0/name, grpc, containerPorts]
KServe unknown flag:   [kserve, ISVC, add, $model/args/-, --model-name=x, --model-name is not]
KServe other runtime:  [kserve, ISVC, replace, $model/runtime, triton, not the ServingRuntime]
""")
SHORTHANDS = {"$args": "/spec/template/spec/containers/0/args", "$c": "/spec/template/spec/containers/0"}
SHORTHANDS |= {"$pod": "/spec/template/spec", "$model": "/spec/predictor/model", "ISVC": "InferenceService"}
SHORTHANDS |= {"HPA": "HorizontalPodAutoscaler", "PDB": "PodDisruptionBudget"}
SOURCES = {
    "base": lambda: render(DEPLOY / "base"),
    "base+tls": lambda: render(DEPLOY / "base", ("tls",)),
    "monitoring": monitoring_docs,
    "kserve": kserve_docs,
}


@pytest.mark.parametrize("name", BREAKAGES)
def test_a_broken_manifest_fails_its_check(name):
    source, kind, op, path, value, expected = BREAKAGES[name]
    docs, (head, _, tail) = SOURCES[source](), path.partition("/")
    json_patch(
        one(docs, SHORTHANDS.get(kind, kind)),
        {"op": op, "path": f"{SHORTHANDS.get(head, head)}/{tail}", "value": value},
    )
    failures = checks.check_kserve(docs) if source == "kserve" else checks.check_variant(docs)
    assert any(expected in f for f in failures), f"expected a failure with {expected!r}, got {failures}"
