"""What a schema cannot see in deploy/k8s/: whether the documents agree with each other.

Each check takes the four documents and raises AssertionError naming what disagrees. A schema says
that ``port: 8000`` is an integer; only these checks say that the Job's engine URL reaches the
Service, that the Service selects the pod that serves HTTP, and that vLLM's ranks add up to one
engine over the LeaderWorkerSet's pods, as the day0 profile describes it.
"""

from __future__ import annotations

import re
import tempfile
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from day0.config.profile import Profile, deep_merge, load_profile, parse_override
from day0.engine.server import cli_args
from tests.support import REPO

DEPLOY = REPO / "deploy" / "k8s"
FILES = ("vllm-lws.yaml", "day0-job.yaml")
LWS_NAME = "leaderworkerset.sigs.k8s.io/name"
LWS_GROUP = "leaderworkerset.sigs.k8s.io/group-index"
LWS_WORKER = "leaderworkerset.sigs.k8s.io/worker-index"
# The flags that make a pod one rank of the engine, or its HTTP front; the rest configure the engine.
RANK_FLAGS = ("--nnodes", "--node-rank", "--master-addr", "--master-port")
HTTP_FLAGS = ("--served-model-name", "--host", "--port", "--api-key")
ROLE_FLAGS = (*RANK_FLAGS, *HTTP_FLAGS, "--headless")


def load_documents() -> list[tuple[str, int, dict[str, Any]]]:
    """(file, position, document) for every YAML document of the two manifest files."""
    return [(name, i, doc) for name in FILES
            for i, doc in enumerate(yaml.safe_load_all((DEPLOY / name).read_text(encoding="utf-8")))]


@dataclass
class Manifests:
    lws: dict[str, Any]
    service: dict[str, Any]
    configmap: dict[str, Any]
    job: dict[str, Any]

    @classmethod
    def load(cls) -> Manifests:
        by_kind: dict[str, list[dict[str, Any]]] = {}
        for _, _, doc in load_documents():
            by_kind.setdefault(doc["kind"], []).append(doc)
        want = ("LeaderWorkerSet", "Service", "ConfigMap", "Job")
        assert sorted(by_kind) == sorted(want) and all(len(v) == 1 for v in by_kind.values()), \
            f"expected one each of {want}, found {({k: len(v) for k, v in by_kind.items()})}"
        return cls(*(by_kind[k][0] for k in want))

    # ------------------------------------------------------------------ views

    @property
    def size(self) -> int:
        return self.lws["spec"]["leaderWorkerTemplate"]["size"]

    def pod(self, role: str) -> dict[str, Any]:
        return self.lws["spec"]["leaderWorkerTemplate"][f"{role}Template"]["spec"]

    def vllm(self, role: str) -> dict[str, Any]:
        (container,) = [c for c in self.pod(role)["containers"] if c["name"] == "vllm"]
        return container

    def job_pod(self) -> dict[str, Any]:
        return self.job["spec"]["template"]["spec"]

    def job_container(self) -> dict[str, Any]:
        (container,) = self.job_pod()["containers"]
        return container

    def job_option(self, name: str) -> list[str]:
        """Every value the Job's pytest command line gives ``name`` (``--opt V`` or ``--opt=V``)."""
        args = [*self.job_container().get("command", []), *self.job_container().get("args", [])]
        return [a.split("=", 1)[1] if a.startswith(name + "=") else args[i + 1]
                for i, a in enumerate(args) if a == name or a.startswith(name + "=")]

    def overrides(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for text in self.job_option("--day0-set"):
            out = deep_merge(out, parse_override(text))
        return out

    def profile_source(self) -> tuple[str | None, str]:
        """(ConfigMap name, key) the file --day0-profile names is mounted from."""
        (path,) = self.job_option("--day0-profile")
        mount, volume = mount_source(self.job_pod(), self.job_container(), path)
        rel = path[len(mount["mountPath"]):].lstrip("/")
        items = {i["path"]: i["key"] for i in volume.get("configMap", {}).get("items", [])}
        return volume.get("configMap", {}).get("name"), items.get(rel, "" if items else rel)

    def profile(self) -> Profile:
        """The Job's profile as day0 would load it: the ConfigMap's file plus the --day0-set overrides."""
        _, key = self.profile_source()
        text = self.configmap["data"][key]
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "site.toml").write_text(text, encoding="utf-8")
            return load_profile(Path(tmp) / "site.toml", overrides=self.overrides())


def vllm_args(container: dict[str, Any]) -> tuple[str, dict[str, str | bool]]:
    """``vllm serve MODEL --flag=V --switch ...`` as (model, {flag: value or True})."""
    assert container.get("command") == ["vllm", "serve"], f"command is {container.get('command')}, not vllm serve"
    args = list(container["args"])
    model, flags = args.pop(0), {}
    while args:
        arg = args.pop(0)
        assert arg.startswith("--"), f"vLLM argument {arg!r} is not a --flag"
        name, eq, value = arg.partition("=")
        assert name not in flags, f"{name} given twice"
        flags[name] = value if eq else (args.pop(0) if args and not args[0].startswith("--") else True)
    return model, flags


def expand(value: Any, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion of a command-line argument."""
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)), str(value))


def gpus(container: dict[str, Any]) -> int:
    return int(container.get("resources", {}).get("limits", {}).get("nvidia.com/gpu", 0))


def mount_source(pod: dict[str, Any], container: dict[str, Any], path: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(volumeMount, volume) of the deepest mount holding ``path`` in this container."""
    mounts = [m for m in container.get("volumeMounts", [])
              if path == m["mountPath"] or path.startswith(m["mountPath"].rstrip("/") + "/")]
    assert mounts, f"{path} is under no volumeMount of container {container['name']}"
    mount = max(mounts, key=lambda m: len(m["mountPath"]))
    volumes = [v for v in pod.get("volumes", []) if v["name"] == mount["name"]]
    assert len(volumes) == 1, f"volumeMount {mount['name']} has {len(volumes)} volumes of that name"
    return mount, volumes[0]


def pyproject_vllm() -> str:
    """The vLLM version of pyproject.toml's gpu extra (``vllm==X``)."""
    extras = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    (pin,) = [p for p in extras["gpu"] if p.startswith("vllm==")]
    return pin.split("==", 1)[1]


Check = Callable[[Manifests], None]


# ---------------------------------------------------------------------- the checks


def job_reaches_the_leader_service(m: Manifests) -> None:
    """engine.url is http://<the Service>:<its port>: the name a pod in the namespace resolves."""
    url = urlsplit(m.profile().engine.url or "")
    name = m.service["metadata"]["name"]
    assert url.scheme == "http" and url.hostname is not None, f"engine.url {url.geturl()!r} is not an http URL"
    assert url.hostname == name or url.hostname.startswith(name + "."), \
        f"engine.url host {url.hostname!r} is not the Service {name!r}"
    ports = [p["port"] for p in m.service["spec"]["ports"]]
    assert url.port in ports, f"engine.url port {url.port} is not a port of Service {name} ({ports})"


def service_selects_the_leader_pod(m: Manifests) -> None:
    """The selector is the labels LWS puts on a leader pod: its set's name and worker index 0."""
    selector = m.service["spec"]["selector"]
    lws = m.lws["metadata"]["name"]
    assert selector.get(LWS_NAME) == lws, f"selector {LWS_NAME}={selector.get(LWS_NAME)!r}, the LWS is {lws!r}"
    assert selector.get(LWS_WORKER) == "0", f"selector {LWS_WORKER}={selector.get(LWS_WORKER)!r}: the leader is '0'"
    group = selector.get(LWS_GROUP, "0")
    assert group.isdigit() and int(group) < m.lws["spec"].get("replicas", 1), f"no group {group!r} in the LWS"
    leader_labels = m.lws["spec"]["leaderWorkerTemplate"].get("leaderTemplate", {}).get("metadata", {}).get("labels", {})
    foreign = {k: v for k, v in selector.items() if k not in (LWS_NAME, LWS_GROUP, LWS_WORKER)
               and leader_labels.get(k) != v}
    assert not foreign, f"selector labels no leader pod carries: {foreign}"
    # LWS makes a headless Service named after the set for its pods' DNS: a second one clashes.
    assert m.service["metadata"]["name"] != lws, f"Service {lws!r} is the name of LWS's own headless Service"


def service_reaches_vllm_port(m: Manifests) -> None:
    """The Service's targetPort is the leader container's port, and vLLM listens on it."""
    (port,) = [p for p in m.service["spec"]["ports"] if p["port"] == urlsplit(m.profile().engine.url or "").port]
    target = port.get("targetPort", port["port"])
    leader = m.vllm("leader")
    numbers = [p["containerPort"] for p in leader.get("ports", []) if target in (p.get("name"), p["containerPort"])]
    assert numbers, f"targetPort {target!r} is no port of the leader's vllm container"
    _, flags = vllm_args(leader)
    assert str(numbers[0]) == str(flags.get("--port")), f"vLLM --port {flags.get('--port')}, the Service sends to {numbers[0]}"


def job_mounts_the_profile_configmap(m: Manifests) -> None:
    """--day0-profile is a key of the ConfigMap in day0-job.yaml, mounted where the path says;
    --day0-out is a writable volume."""
    name, key = m.profile_source()
    assert name == m.configmap["metadata"]["name"], \
        f"--day0-profile comes from ConfigMap {name!r}, not {m.configmap['metadata']['name']!r} (day0-job.yaml)"
    assert key in m.configmap["data"], f"--day0-profile: ConfigMap {name} has no key {key!r} ({sorted(m.configmap['data'])})"
    (out,) = m.job_option("--day0-out")
    mount, _ = mount_source(m.job_pod(), m.job_container(), out)
    assert not mount.get("readOnly"), f"--day0-out {out} is on a read-only mount"


def nnodes_is_the_group_size(m: Manifests) -> None:
    """--nnodes, on every pod, is the LWS size (LWS_GROUP_SIZE, or the number itself)."""
    for role in ("leader", "worker"):
        _, flags = vllm_args(m.vllm(role))
        nnodes = expand(flags.get("--nnodes"), {"LWS_GROUP_SIZE": str(m.size)})
        assert nnodes == str(m.size), f"{role}: --nnodes {flags.get('--nnodes')} is not the LWS size {m.size}"


def ranks_meet_at_the_leader(m: Manifests) -> None:
    """The leader is rank 0, each worker its own index, and all meet at the leader's address."""
    leader, worker = vllm_args(m.vllm("leader"))[1], vllm_args(m.vllm("worker"))[1]
    assert expand(leader.get("--node-rank"), {"LWS_WORKER_INDEX": "0"}) == "0", \
        f"leader --node-rank {leader.get('--node-rank')}: must be 0"
    assert worker.get("--node-rank") == "$(LWS_WORKER_INDEX)", \
        f"worker --node-rank {worker.get('--node-rank')}: each worker pod needs its own, $(LWS_WORKER_INDEX)"
    for flag in ("--master-addr", "--master-port"):
        assert leader.get(flag) == worker.get(flag) and leader.get(flag), \
            f"{flag}: leader {leader.get(flag)!r}, workers {worker.get(flag)!r}"
    assert leader["--master-addr"] == "$(LWS_LEADER_ADDRESS)", \
        f"--master-addr {leader['--master-addr']}: the leader pod's address is $(LWS_LEADER_ADDRESS)"


def headless_only_on_workers(m: Manifests) -> None:
    """Rank 0 serves HTTP; every other rank runs --headless, with no HTTP flag."""
    leader, worker = vllm_args(m.vllm("leader"))[1], vllm_args(m.vllm("worker"))[1]
    assert "--headless" not in leader, "the leader runs --headless: nothing would serve HTTP"
    assert "--port" in leader, "the leader gives no --port"
    assert worker.get("--headless") is True, "the workers do not run --headless: each would start an API server"
    http = [f for f in HTTP_FLAGS if f in worker]
    assert not http, f"workers carry HTTP flags {http}"


def one_engine_on_every_pod(m: Manifests) -> None:
    """Leader and workers start the same engine: same image, model and engine flags."""
    (leader_model, leader), (worker_model, worker) = vllm_args(m.vllm("leader")), vllm_args(m.vllm("worker"))
    assert leader_model == worker_model, f"model: leader {leader_model}, workers {worker_model}"
    assert m.vllm("leader")["image"] == m.vllm("worker")["image"], "leader and workers run different images"
    engine = [{k: v for k, v in flags.items() if k not in ROLE_FLAGS} for flags in (leader, worker)]
    differ = {k: (engine[0].get(k), engine[1].get(k)) for k in engine[0].keys() | engine[1].keys()
              if engine[0].get(k) != engine[1].get(k)}
    assert not differ, f"engine flags differ between leader and workers (leader, worker): {differ}"


def gpus_hold_the_parallel_layout(m: Manifests) -> None:
    """TP x PP ranks = pods x GPUs per pod, the same GPU count on every pod."""
    per_pod = {role: gpus(m.vllm(role)) for role in ("leader", "worker")}
    assert per_pod["leader"] == per_pod["worker"] > 0, f"nvidia.com/gpu per pod: {per_pod}"
    _, flags = vllm_args(m.vllm("leader"))
    world = int(flags.get("--tensor-parallel-size", 1)) * int(flags.get("--pipeline-parallel-size", 1))
    assert world == m.size * per_pod["leader"], \
        f"TP x PP = {world} ranks, but {m.size} pods x {per_pod['leader']} GPUs = {m.size * per_pod['leader']}"


def workers_start_with_the_leader(m: Manifests) -> None:
    """startupPolicy LeaderReady would wait for a leader whose /health needs the workers."""
    probed = any(k in m.vllm("leader") for k in ("readinessProbe", "startupProbe"))
    policy = m.lws["spec"].get("startupPolicy", "LeaderCreated")
    assert not (probed and policy == "LeaderReady"), \
        "startupPolicy LeaderReady: the leader is ready only once the workers it waits for exist"


def profile_describes_the_deployment(m: Manifests) -> None:
    """The Job's profile loads (day0's own loader) and is the engine the LWS runs: external mode,
    the served name, [engine.args] flag for flag, nodes and devices, model.path."""
    profile = m.profile()
    model, flags = vllm_args(m.vllm("leader"))
    assert profile.engine.mode == "external", f"engine.mode {profile.engine.mode!r}: day0 must not start an engine"
    assert profile.model.served_model_name == flags.get("--served-model-name"), \
        f"model.served_model_name {profile.model.served_model_name!r}, vLLM serves {flags.get('--served-model-name')!r}"
    _, want = vllm_args({"command": ["vllm", "serve"], "args": ["model", *cli_args(profile.engine.args)]})
    have = {k: v for k, v in flags.items() if k not in ROLE_FLAGS}
    differ = {k: (have.get(k), want.get(k)) for k in have.keys() | want.keys() if have.get(k) != want.get(k)}
    assert not differ, f"vLLM flags differ from the profile's [engine.args] (vLLM, profile): {differ}"
    assert (profile.topology.nodes, profile.topology.devices_per_node) == (m.size, gpus(m.vllm("leader"))), \
        f"topology {profile.topology.nodes} nodes x {profile.topology.devices_per_node} devices, " \
        f"the LWS {m.size} pods x {gpus(m.vllm('leader'))} GPUs"
    assert profile.model.path == model, f"model.path {profile.model.path!r}, vLLM serves {model!r}"


def model_volume_is_shared(m: Manifests) -> None:
    """The checkpoint path is on the same claim in the vLLM pods and the Job (its weights audit)."""
    model, _ = vllm_args(m.vllm("leader"))
    sources = {"leader": mount_source(m.pod("leader"), m.vllm("leader"), model),
               "worker": mount_source(m.pod("worker"), m.vllm("worker"), model),
               "job": mount_source(m.job_pod(), m.job_container(), model)}
    claims = {who: v.get("persistentVolumeClaim", {}).get("claimName") for who, (_, v) in sources.items()}
    assert len(set(claims.values())) == 1 and None not in claims.values(), f"{model} comes from {claims}"


def api_key_comes_from_one_secret(m: Manifests) -> None:
    """The Job's engine.api_key_env variable and vLLM's VLLM_API_KEY read the same Secret key."""
    name = m.profile().engine.api_key_env
    if name is None:
        assert not any(e["name"] == "VLLM_API_KEY" for e in m.vllm("leader").get("env", [])), \
            "vLLM is keyed but the Job sets no engine.api_key_env: every request would get 401"
        return
    job = [e for e in m.job_container().get("env", []) if e["name"] == name]
    vllm = [e for e in m.vllm("leader").get("env", []) if e["name"] == "VLLM_API_KEY"]
    assert job and "secretKeyRef" in job[0].get("valueFrom", {}), f"the Job's {name} is not read from a Secret"
    assert vllm and vllm[0].get("valueFrom") == job[0]["valueFrom"], \
        f"vLLM's key {vllm[0].get('valueFrom') if vllm else None} is not the Job's {job[0]['valueFrom']}"


def vllm_image_is_pyprojects(m: Manifests) -> None:
    """The vLLM image is the version day0 is pinned to (pyproject's gpu extra)."""
    want = f"vllm/vllm-openai:v{pyproject_vllm()}"
    for role in ("leader", "worker"):
        assert m.vllm(role)["image"] == want, f"{role} image {m.vllm(role)['image']}, pyproject pins {want}"


CHECKS: tuple[Check, ...] = (
    job_reaches_the_leader_service, service_selects_the_leader_pod, service_reaches_vllm_port,
    job_mounts_the_profile_configmap, nnodes_is_the_group_size, ranks_meet_at_the_leader,
    headless_only_on_workers, one_engine_on_every_pod, gpus_hold_the_parallel_layout,
    workers_start_with_the_leader, profile_describes_the_deployment, model_volume_is_shared,
    api_key_comes_from_one_secret, vllm_image_is_pyprojects,
)
