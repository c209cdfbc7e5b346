#!/usr/bin/env python3
"""Kubernetes manifests against the real `attnserve serve`: flags, ports, probes, timings, scaling.

    python deploy/check_manifests.py deploy/overlays/tls-auth                # a kustomization, yours too
    python deploy/check_manifests.py deploy/base deploy/monitoring           # checked together
    python deploy/check_manifests.py deploy/kserve                           # plain YAML files

A server container's arguments go through `attnserve serve`'s own parser and ServerConfig.check();
its ports, probes, grace period, resources and mounted files are then held against that config,
the server's health service names and its metric names, and so are the Service, the
PodDisruptionBudget, the HorizontalPodAutoscaler, the PodMonitor, the adapter rule and KServe's
ServingRuntime and InferenceService around it. Each check returns every failure it finds, saying
what was expected and what came. A kustomization is rendered by `kubectl kustomize` when kubectl
is installed, else by the part of kustomize deploy/ uses (resources, components, RFC 6902
patches). Needs attnserve installed (no model, no cluster). tests/test_deploy.py runs it on deploy/.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import io
import re
import shutil
import subprocess
import sys
from contextlib import redirect_stderr
from pathlib import Path, PurePosixPath

import yaml

from attnserve import cli
from attnserve.server.app import HEALTH_SERVICES, WARMUP_TIMEOUT_S
from attnserve.server.config import ServerConfig, parse_bytes
from attnserve.server.metrics import Metrics

DEPLOY = Path(__file__).resolve().parent
STOP_S = 1.0  # after --drain-timeout, Server.drain gives grpc.stop at least this long
PROBES = ("startupProbe", "readinessProbe", "livenessProbe")
PROBE_COMMAND = "attnserve-health-probe"  # deploy/health_probe.py, as the Dockerfile installs it
KSERVE_MOUNT = "/mnt/models"  # where KServe puts an InferenceService's storageUri
Failures = list[str]


def load(path: Path) -> list:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


SERVE = cli.subcommand_parser("serve")  # `attnserve serve`'s parser, built by the CLI itself
SERVE_FLAGS = set(re.findall(r"--[a-z][a-z0-9-]*", SERVE.format_usage()))  # what `attnserve serve --help` lists
METRICS = {m.name for m in Metrics().registry.collect()}


def load_sibling(name: str):
    """deploy/NAME.py as a module: deploy/ is a folder of files, not a package."""
    spec = importlib.util.spec_from_file_location(name, DEPLOY / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


health_probe = load_sibling("health_probe")


def parse(parser: argparse.ArgumentParser, args: list[str]) -> tuple[argparse.Namespace | None, str]:
    """The namespace, or None and argparse's one-line complaint."""
    err = io.StringIO()
    try:
        with redirect_stderr(err):
            return parser.parse_args(args), ""
    except SystemExit:
        return None, err.getvalue().strip().splitlines()[-1]


def parse_serve(args: list[str]) -> tuple[ServerConfig | None, Failures]:
    """`attnserve serve ARGS` as the server takes it: exact flag names (no abbreviations), values, check()."""
    names = [a.split("=")[0] for a in args if a.startswith("--")]
    failures = [f"{n} is not a flag of `attnserve serve`: {sorted(SERVE_FLAGS)}" for n in names if n not in SERVE_FLAGS]
    namespace, complaint = parse(SERVE, args)
    if namespace is None:
        return None, [*failures, f"`attnserve serve {' '.join(args)}`: {complaint}"]
    config = ServerConfig.from_args(namespace)
    try:
        config.check()
    except ValueError as e:
        return None, [*failures, f"`attnserve serve {' '.join(args)}`: {e}"]
    return config, failures


# ---- the part of kustomize that deploy/ uses --------------------------------------------------
def json_patch(doc: dict, op: dict) -> None:
    """One RFC 6902 operation (add, replace, remove) on doc, in place."""
    *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
    node = doc
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    index = (len(node) if last == "-" else int(last)) if isinstance(node, list) else last
    if op["op"] not in ("add", "replace", "remove"):
        raise ValueError(f"{op['op']}: not an operation this renderer knows")
    if op["op"] != "add":
        del node[index]
    if op["op"] != "remove":
        value = copy.deepcopy(op["value"])
        node.insert(index, value) if isinstance(node, list) else node.__setitem__(index, value)


def targets(doc: dict, target: dict) -> bool:
    api = "/".join(filter(None, (target.get("group"), target.get("version")))) or None
    wanted = {"kind": target.get("kind"), "name": target.get("name"), "apiVersion": api}
    found = {"kind": doc["kind"], "name": doc["metadata"]["name"], "apiVersion": doc["apiVersion"]}
    return all(found[k] == v for k, v in wanted.items() if v is not None)


def resources(directory: Path) -> list[dict]:
    """The objects a kustomization or component lists, rendered."""
    entries = load(directory / "kustomization.yaml")[0].get("resources", [])
    return [d for e in entries for d in (render(directory / e) if (directory / e).is_dir() else load(directory / e))]


def render(directory: Path, components: tuple[str, ...] = ()) -> list[dict]:
    """What `kubectl kustomize directory` prints, with `components` (of deploy/components) added."""
    docs = resources(directory)
    listed = load(directory / "kustomization.yaml")[0].get("components", [])
    for component in [directory / c for c in listed] + [DEPLOY / "components" / c for c in components]:
        docs += resources(component)
        patch(component, docs)
    patch(directory, docs)
    return docs


def patch(directory: Path, docs: list[dict]) -> None:
    for entry in load(directory / "kustomization.yaml")[0].get("patches", []):
        for op in load(directory / entry["path"])[0]:
            for doc in (d for d in docs if targets(d, entry["target"])):
                json_patch(doc, op)


def dockerfile() -> dict[str, list[str]]:
    """deploy/Dockerfile's instructions by keyword, continuation lines joined."""
    text = re.sub(r"\\\n\s*", " ", (DEPLOY / "Dockerfile").read_text())
    steps: dict[str, list[str]] = {}
    for line in (line.strip() for line in text.splitlines()):
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            steps.setdefault(keyword, []).append(rest.strip())
    return steps


# Where the image keeps its model directories: COPY models/${MODEL_NAME} ROOT/${MODEL_NAME}.
COPY_MODEL = re.compile(r"models/\$\{MODEL_NAME\} (\S+)/\$\{MODEL_NAME\}")
MODEL_ROOTS = [m.group(1) for c in dockerfile()["COPY"] if (m := COPY_MODEL.fullmatch(c))]


# ---- checks: each returns every failure it finds ----------------------------------------------
def one(docs: list[dict], kind: str) -> dict:
    found = [d for d in docs if d["kind"] == kind]
    if len(found) != 1:
        raise ValueError(f"expected one {kind}, found {len(found)}")
    return found[0]


def selects(selector: dict, labels: dict) -> bool:
    return bool(selector) and selector.items() <= labels.items()


def under(path: str | None, roots: list[str]) -> bool:
    return path is None or any(PurePosixPath(path).is_relative_to(root) for root in roots)


def quantity(value: str | int) -> float:
    """A Kubernetes quantity without a binary suffix: "4", "3500m"."""
    text = str(value)
    return float(text[:-1]) / 1000 if text.endswith("m") else float(text)


def check_server(
    pod: dict, container: dict, more_args: list[str], model_roots: list[str]
) -> tuple[ServerConfig | None, Failures]:
    """The container's `attnserve serve` command, arguments, resources and files: (config, failures)."""
    failures = [] if container.get("command") == ["attnserve", "serve"] else [f"command {container.get('command')}"]
    config, parse_failures = parse_serve([*container.get("args", []), *more_args])
    if config is None:
        return None, failures + parse_failures
    failures += parse_failures
    if config.host not in ("0.0.0.0", "::"):
        failures.append(f"--host {config.host}: only the pod itself could connect; give --host=0.0.0.0")
    requests, limits = (container.get("resources", {}).get(k, {}) for k in ("requests", "limits"))
    if "cpu" not in requests or "memory" not in limits:
        failures.append(f"resources {container.get('resources')}: need a cpu request (the HPA's 100%), a memory limit")
    cores = quantity(limits.get("cpu", requests.get("cpu", 0)))
    if not 1 <= config.threads <= max(1, cores - 1):
        failures.append(
            f"--threads {config.threads} on {cores} cores: give 1 to {max(1, cores - 1):.0f}, not the node's"
        )
    memory = parse_bytes(str(limits.get("memory", 0)))
    if config.kv_cache_memory is not None and config.kv_cache_memory >= memory:
        failures.append(f"--kv-cache-memory {config.kv_cache_memory} bytes does not fit the memory limit {memory}")
    elif config.prefix_cache == "on" and config.prefix_cache_memory is None:
        failures.append("--prefix-cache-memory unset: its default follows the node's free memory, not the pod's limit")
    elif config.prefix_cache == "on" and (config.kv_cache_memory or 0) + config.prefix_cache_memory >= memory:
        failures.append(
            f"--kv-cache-memory and --prefix-cache-memory ({config.kv_cache_memory} + {config.prefix_cache_memory} "
            f"bytes) do not fit the memory limit {memory}"
        )
    volumes = {v["name"] for v in pod.get("volumes", [])}
    mounts = container.get("volumeMounts", [])
    failures += [f"volumeMount {m['name']} has no volume" for m in mounts if m["name"] not in volumes]
    paths = [m["mountPath"] for m in mounts]
    for name in ("tls_cert", "tls_key", "tls_client_ca", "auth_token_file"):
        if not under(getattr(config, name), paths):
            failures.append(f"--{name.replace('_', '-')} {getattr(config, name)} is in no volumeMount {paths}")
    if not under(config.model, paths + model_roots):
        failures.append(f"--model {config.model} is neither mounted {paths} nor in the image's {model_roots}")
    return config, failures


def check_ports(container: dict, expected: dict[str, int | None]) -> Failures:
    ports = {p.get("name"): p["containerPort"] for p in container.get("ports", [])}
    expected = {name: port for name, port in expected.items() if port is not None}
    return [] if ports == expected else [f"containerPorts {ports}, expected {expected} from the flags"]


def check_probe(name: str, probe: dict | None, config: ServerConfig, mounts: list[str]) -> Failures:
    """A gRPC probe (plaintext servers) or attnserve-health-probe, on --port, asking a service health knows."""
    failures: Failures = []
    if probe is None:
        return [f"no {name}"]
    if "grpc" in probe:
        if config.tls_cert:
            return [f"{name}: the kubelet's gRPC probes speak plaintext, the server TLS; exec {PROBE_COMMAND}"]
        port, service = probe["grpc"].get("port"), probe["grpc"].get("service", "")
    elif (probe.get("exec", {}).get("command") or [""])[0] == PROBE_COMMAND:
        args, complaint = parse(health_probe.build_parser(), probe["exec"]["command"][1:])
        if args is None:
            return [f"{name}: {complaint}"]
        port, service = args.port, args.service
        if config.tls_cert and not args.tls_ca:
            failures.append(f"{name}: the server runs TLS; give the probe --tls-ca")
        if config.tls_client_ca and not (args.tls_cert and args.tls_key):
            failures.append(f"{name}: the server wants client certificates; give the probe --tls-cert, --tls-key")
        failures += [f"{name}: {p} is in no volumeMount" for p in (args.tls_ca, args.tls_cert) if not under(p, mounts)]
    else:
        return [f"{name} {probe}: neither a gRPC probe nor {PROBE_COMMAND}"]
    if port != config.port:
        failures.append(f"{name} probes port {port}, the server listens on --port {config.port}")
    if service not in HEALTH_SERVICES:
        failures.append(f"{name} asks health about {service!r}; the server answers for {HEALTH_SERVICES}")
    return failures


def check_lifecycle(pod: dict, container: dict, config: ServerConfig) -> Failures:
    """Probes, then: startup outlasts the warm-up, grace outlasts preStop + drain."""
    mounts = [m["mountPath"] for m in container.get("volumeMounts", [])]
    failures = [f for name in PROBES for f in check_probe(name, container.get(name), config, mounts)]
    startup = container.get("startupProbe") or {}
    budget = startup.get("periodSeconds", 10) * startup.get("failureThreshold", 3)
    if startup.get("initialDelaySeconds", 0) + budget < WARMUP_TIMEOUT_S:
        failures.append(f"startupProbe allows {budget} s; the server's warm-up may take {WARMUP_TIMEOUT_S} s")
    pre_stop = container.get("lifecycle", {}).get("preStop", {})
    command = pre_stop.get("exec", {}).get("command", [])
    sleep = float(command[1]) if command[:1] == ["sleep"] else pre_stop.get("sleep", {}).get("seconds")
    if sleep is None:
        return [*failures, f"preStop {pre_stop}: sleep a few seconds so that endpoint removal precedes the drain"]
    grace, needed = pod.get("terminationGracePeriodSeconds", 30), sleep + config.drain_timeout + STOP_S
    if grace <= needed:
        failures.append(
            f"terminationGracePeriodSeconds {grace} <= preStop {sleep} + --drain-timeout {config.drain_timeout}"
            f" + {STOP_S} to stop"
        )
    return failures


def check_deployment(docs: list[dict]) -> tuple[ServerConfig | None, Failures]:
    deployment = one(docs, "Deployment")
    template = deployment["spec"]["template"]
    pod, labels = template["spec"], template["metadata"]["labels"]
    container = next(c for c in pod["containers"] if c.get("command", [])[:1] == ["attnserve"])
    config, failures = check_server(pod, container, [], MODEL_ROOTS)
    if not selects(deployment["spec"]["selector"].get("matchLabels", {}), labels):
        failures.append(f"Deployment selector {deployment['spec']['selector']} does not select its pods {labels}")
    if config is None:
        return None, failures
    failures += check_ports(container, {"grpc": config.port, "metrics": config.metrics_port, "http": config.http_port})
    failures += check_lifecycle(pod, container, config)
    scraped = template["metadata"].get("annotations", {}).get("prometheus.io/port")
    if scraped not in (None, str(config.metrics_port)):
        failures.append(f"prometheus.io/port {scraped}, --metrics-port {config.metrics_port}")
    return config, failures


def check_around(docs: list[dict], config: ServerConfig) -> Failures:
    """The Service, PodDisruptionBudget and HorizontalPodAutoscaler around the Deployment."""
    deployment, service, pdb = (one(docs, k) for k in ("Deployment", "Service", "PodDisruptionBudget"))
    labels, failures = deployment["spec"]["template"]["metadata"]["labels"], []
    if service["spec"].get("clusterIP") != "None":
        failures.append(f"Service clusterIP {service['spec'].get('clusterIP')}: headless (None) lists every pod")
    for kind, selector in [
        ("Service", service["spec"].get("selector")),
        ("PDB", pdb["spec"]["selector"]["matchLabels"]),
    ]:
        if not selects(selector, labels):
            failures.append(f"{kind} selector {selector} does not select the pods {labels}")
    served = {"grpc": ("--port", config.port), "http": ("--http-port", config.http_port)}
    for port in service["spec"]["ports"]:
        flag, number = served.get(port.get("name"), ("--port", config.port))
        if number is None or port["port"] != number or port.get("targetPort") not in (port.get("name"), number):
            failures.append(f"Service port {port}: clients of a headless Service dial the pods' {flag} {number}")
    hpa = one(docs, "HorizontalPodAutoscaler")["spec"]
    if hpa["scaleTargetRef"] != {"apiVersion": "apps/v1", "kind": "Deployment", "name": deployment["metadata"]["name"]}:
        failures.append(f"HPA scaleTargetRef {hpa['scaleTargetRef']} is not the Deployment")
    if "replicas" in deployment["spec"]:
        failures.append("Deployment sets replicas: every apply would undo the HPA's count")
    for metric in (m["pods"] for m in hpa["metrics"] if m["type"] == "Pods"):
        if metric["metric"]["name"] not in METRICS:
            failures.append(f"HPA metric {metric['metric']['name']} is not one of the server's {sorted(METRICS)}")
        if quantity(metric["target"]["averageValue"]) >= config.max_queue:
            failures.append(f"HPA target {metric['target']} should sit below --max-queue {config.max_queue}")
    kinds = {m["type"] if m["type"] != "Resource" else m["resource"]["name"] for m in hpa["metrics"]}
    if not {"Pods", "cpu"} <= kinds:
        failures.append(f"HPA on {sorted(kinds)}: it needs a Pods metric (queue depth) and cpu (the fallback)")
    return failures


def check_monitoring(docs: list[dict], config: ServerConfig) -> Failures:
    """The PodMonitor scrapes --metrics-port; the adapter serves the HPA's metric from a real series."""
    template = one(docs, "Deployment")["spec"]["template"]
    ports = {p["name"]: p["containerPort"] for p in template["spec"]["containers"][0]["ports"]}
    monitor, failures = one(docs, "PodMonitor")["spec"], []
    if not selects(monitor["selector"]["matchLabels"], template["metadata"]["labels"]):
        failures.append(f"PodMonitor selector {monitor['selector']} does not select the pods")
    if [ports.get(e["port"]) for e in monitor["podMetricsEndpoints"]] != [config.metrics_port]:
        failures.append(f"PodMonitor scrapes {monitor['podMetricsEndpoints']}, not --metrics-port")
    rules = yaml.safe_load(one(docs, "ConfigMap")["data"]["config.yaml"])["rules"]
    hpa = one(docs, "HorizontalPodAutoscaler")["spec"]["metrics"]
    wanted = {m["pods"]["metric"]["name"] for m in hpa if m["type"] == "Pods"}
    if wanted - {rule["name"]["as"] for rule in rules}:
        failures.append(f"the adapter serves {[r['name']['as'] for r in rules]}, the HPA wants {sorted(wanted)}")
    for rule in rules:
        if rule["seriesQuery"].split("{")[0] not in METRICS:
            failures.append(f"adapter rule on {rule['seriesQuery']}: no such series among {sorted(METRICS)}")
        if rule["resources"]["overrides"].keys() != {"namespace", "pod"}:
            failures.append(f"adapter rule maps {rule['resources']}: it needs namespace and pod")
    return failures


def check_variant(docs: list[dict]) -> Failures:
    config, failures = check_deployment(docs)
    if config is not None:
        failures += check_around(docs, config)
        failures += check_monitoring(docs, config) if any(d["kind"] == "PodMonitor" for d in docs) else []
    return failures


def check_kserve(docs: list[dict]) -> Failures:
    """The InferenceService's model on the attnserve ServingRuntime: gRPC Open Inference Protocol on --port."""
    runtime, isvc = one(docs, "ServingRuntime")["spec"], one(docs, "InferenceService")["spec"]["predictor"]
    model, failures = isvc["model"], []
    if model["runtime"] != one(docs, "ServingRuntime")["metadata"]["name"]:
        failures.append(f"runtime {model['runtime']} is not the ServingRuntime")
    if model["modelFormat"]["name"] not in [f["name"] for f in runtime["supportedModelFormats"]]:
        failures.append(f"modelFormat {model['modelFormat']} is not one the runtime supports")
    protocol = model.get("protocolVersion", "v1")
    if protocol not in runtime["protocolVersions"] or not protocol.startswith("grpc-"):
        failures.append(f"protocolVersion {protocol}: attnserve serves gRPC only (grpc-v2)")
    container = next(c for c in runtime["containers"] if c["name"] == "kserve-container")
    roots = [KSERVE_MOUNT] if model.get("storageUri") else MODEL_ROOTS
    config, more = check_server({}, container, model.get("args", []), roots)  # KServe appends the model's args
    if config is None:
        return failures + more
    failures += more + check_ports(container, {"h2c": config.port})
    scraped = runtime.get("annotations", {}).get("prometheus.kserve.io/port")
    if scraped not in (None, str(config.metrics_port)):
        failures.append(f"prometheus.kserve.io/port {scraped}, --metrics-port {config.metrics_port}")
    if isvc.get("scaleTarget", 0) > config.max_batch:
        failures.append(f"scaleTarget {isvc['scaleTarget']} requests in flight exceeds --max-batch {config.max_batch}")
    return failures


def rendered(directory: Path) -> list[dict]:
    """A kustomization by `kubectl kustomize` where kubectl is installed, else by render()."""
    if shutil.which("kubectl") is None:
        return render(directory)
    out = subprocess.run(["kubectl", "kustomize", str(directory)], capture_output=True, text=True, check=True)
    return list(yaml.safe_load_all(out.stdout))


def objects(directory: Path) -> list[dict]:
    """A kustomization, rendered, or a folder's YAML files."""
    if (directory / "kustomization.yaml").exists():
        return rendered(directory)
    return [d for path in sorted(directory.glob("*.yaml")) for d in load(path)]


def check(docs: list[dict]) -> Failures:
    """A Deployment with what surrounds it, and a KServe runtime with its InferenceService."""
    kinds = {d["kind"] for d in docs}
    if not kinds & {"Deployment", "ServingRuntime"}:
        return [f"nothing to check among {sorted(kinds)}: no Deployment, no ServingRuntime"]
    failures = check_variant(docs) if "Deployment" in kinds else []
    return failures + (check_kserve(docs) if "ServingRuntime" in kinds else [])


def main(argv: list[str] | None = None) -> int:
    """Check the objects of all the directories given, together; print every failure, exit 1 if any."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("directories", nargs="+", type=Path, help="kustomizations or folders of manifests")
    directories = p.parse_args(argv).directories
    try:
        failures = check([d for directory in directories for d in objects(directory)])
    except (KeyError, IndexError, TypeError, ValueError, StopIteration, subprocess.CalledProcessError) as e:
        failures = [f"cannot check them: {type(e).__name__}: {e}"]
    print(f"{' '.join(map(str, directories))}: {'ok' if not failures else f'{len(failures)} failed'}")
    print("".join(f"  - {f}\n" for f in failures), end="")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
