"""deploy/k8s/ on paper, but checked: every document against the schema its API publishes, then
the wiring between documents that no schema sees (tests/deploy/k8s_wiring.py).

No cluster runs here. What a cluster would refuse at ``kubectl apply`` (a misspelled field, a
string where an integer goes) is refused by the vendored schemas (tests/data/k8s-schemas/); what
it would accept and then fail at run time (a Job pointed at the wrong port, a worker that serves
HTTP, --nnodes that is not the group size) is refused by the wiring checks. Each kind of check is
shown to fail on a manifest broken on purpose, so a check that passes says something.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from tests.deploy import k8s_schemas, k8s_wiring
from tests.deploy.k8s_wiring import CHECKS, Manifests

DOCUMENTS = k8s_wiring.load_documents()


def _id(name: str, i: int, doc: dict[str, Any]) -> str:
    return f"{name}#{i}-{doc.get('kind')}-{doc.get('metadata', {}).get('name')}"


@pytest.mark.parametrize("doc", [d for _, _, d in DOCUMENTS], ids=[_id(*d) for d in DOCUMENTS])
def test_each_document_matches_its_published_schema(doc: dict[str, Any]) -> None:
    assert k8s_schemas.errors(doc) == []


@pytest.mark.parametrize("rel", sorted(k8s_schemas.PINNED))
def test_the_vendored_schemas_are_the_published_bytes(rel: str) -> None:
    """A schema edited by hand (or trimmed) is not the one the cluster applies."""
    assert k8s_schemas.sha256(rel) == k8s_schemas.PINNED[rel]
    sources = (k8s_schemas.SCHEMAS / "SOURCES.md").read_text(encoding="utf-8")
    assert k8s_schemas.PINNED[rel] in sources and rel.removesuffix(".gz").split("/")[-1] in sources


def test_the_crd_is_the_leaderworkerset_one() -> None:
    crd = k8s_schemas.lws_crd()
    assert crd["kind"] == "CustomResourceDefinition"
    assert (crd["spec"]["group"], crd["spec"]["names"]["kind"]) == ("leaderworkerset.x-k8s.io", "LeaderWorkerSet")


# --------------------------------------------------------------- the schemas constrain


def _doc(kind: str) -> dict[str, Any]:
    (doc,) = [copy.deepcopy(d) for _, _, d in DOCUMENTS if d["kind"] == kind]
    return doc


def _rename(d: dict[str, Any], old: str, new: str) -> None:
    d[new] = d.pop(old)


def _lws_template(doc: dict[str, Any], role: str) -> dict[str, Any]:
    return doc["spec"]["leaderWorkerTemplate"][f"{role}Template"]["spec"]


BROKEN: dict[str, tuple[str, Callable[[dict[str, Any]], None], str]] = {
    "job-typo-contaners": ("Job", lambda d: _rename(d["spec"]["template"]["spec"], "containers", "contaners"),
                           "'contaners' was unexpected"),
    "job-backoff-as-string": ("Job", lambda d: d["spec"].update(backoffLimit="0"), "'0' is not of type 'integer'"),
    "job-env-missing-name": ("Job", lambda d: d["spec"]["template"]["spec"]["containers"][0]["env"][0].pop("name"),
                             "'name' is a required property"),
    "service-port-as-string": ("Service", lambda d: d["spec"]["ports"][0].update(port="8000"),
                               "'8000' is not of type 'integer'"),
    "service-typo-selctor": ("Service", lambda d: _rename(d["spec"], "selector", "selctor"),
                             "'selctor' was unexpected"),
    "configmap-data-not-string": ("ConfigMap", lambda d: d["data"].update(nodes=4), "4 is not of type 'string'"),
    "lws-size-as-string": ("LeaderWorkerSet", lambda d: d["spec"]["leaderWorkerTemplate"].update(size="4"),
                           "'4' is not of type 'integer'"),
    "lws-worker-typo-contaners": ("LeaderWorkerSet", lambda d: _rename(_lws_template(d, "worker"), "containers",
                                                                       "contaners"), "'contaners' was unexpected"),
    "lws-leader-port-as-string": ("LeaderWorkerSet",
                                  lambda d: _lws_template(d, "leader")["containers"][0]["ports"][0].update(
                                      containerPort="8000"), "'8000' is not of type 'integer'"),
    "lws-bad-restart-policy": ("LeaderWorkerSet",
                               lambda d: d["spec"]["leaderWorkerTemplate"].update(restartPolicy="Always"),
                               "'Always' is not one of"),
    "lws-typo-at-the-root": ("LeaderWorkerSet", lambda d: _rename(d, "spec", "sepc"), "'sepc' was unexpected"),
    "lws-metadata-typo": ("LeaderWorkerSet", lambda d: d["metadata"].update(lables={}), "'lables' was unexpected"),
    "lws-name-not-dns": ("LeaderWorkerSet", lambda d: d["metadata"].update(name="Day0_vLLM"), "is not a DNS label"),
    "lws-wrong-version": ("LeaderWorkerSet", lambda d: d.update(apiVersion="leaderworkerset.x-k8s.io/v2"),
                          "is not leaderworkerset.x-k8s.io/v1"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_the_schema_refuses_a_broken_document(case: str) -> None:
    kind, breaks, expected = BROKEN[case]
    doc = _doc(kind)
    breaks(doc)
    found = k8s_schemas.errors(doc)
    assert any(expected in e for e in found), found


def test_a_kind_with_no_vendored_schema_is_an_error() -> None:
    assert k8s_schemas.errors({"apiVersion": "apps/v1", "kind": "Deployment"}) != []


def test_maps_stay_open_under_the_strict_rule() -> None:
    """The unknown-field rule closes objects with listed fields, not maps: any label or resource name goes."""
    doc = _doc("LeaderWorkerSet")
    leader = _lws_template(doc, "leader")
    leader["containers"][0]["resources"]["limits"]["example.com/fpga"] = 1
    doc["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["metadata"] = {"labels": {"any.example/key": "v"}}
    assert k8s_schemas.errors(doc) == []


# --------------------------------------------------------------- the wiring


@pytest.fixture(scope="module")
def manifests() -> Manifests:
    return Manifests.load()


@pytest.mark.parametrize("check", CHECKS, ids=[c.__name__ for c in CHECKS])
def test_the_documents_are_wired_together(check: k8s_wiring.Check, manifests: Manifests) -> None:
    check(manifests)


def _args(container: dict[str, Any], old: str, new: str | None) -> None:
    """Replace (or, with None, drop) one command-line argument."""
    i = container["args"].index(old)
    container["args"][i:i + 1] = [] if new is None else [new]


def _both(m: Manifests, old: str, new: str) -> None:
    for role in ("leader", "worker"):
        _args(m.vllm(role), old, new)


def _job_env(m: Manifests) -> dict[str, Any]:
    return m.job_container()["env"][0]["valueFrom"]["secretKeyRef"]


MISWIRED: dict[str, tuple[k8s_wiring.Check, Callable[[Manifests], None]]] = {
    "service-port-moved": (k8s_wiring.job_reaches_the_leader_service,
                           lambda m: m.service["spec"]["ports"][0].update(port=8001)),
    "url-names-the-lws": (k8s_wiring.job_reaches_the_leader_service,
                          lambda m: _args(m.job_container(), 'engine.url="http://day0-vllm-leader:8000"',
                                          'engine.url="http://day0-vllm:8000"')),
    "selects-worker-1": (k8s_wiring.service_selects_the_leader_pod,
                         lambda m: m.service["spec"]["selector"].update({k8s_wiring.LWS_WORKER: "1"})),
    "selects-another-set": (k8s_wiring.service_selects_the_leader_pod,
                            lambda m: m.service["spec"]["selector"].update({k8s_wiring.LWS_NAME: "vllm"})),
    "service-named-like-the-lws": (k8s_wiring.service_selects_the_leader_pod,
                                   lambda m: m.service["metadata"].update(name="day0-vllm")),
    "vllm-listens-elsewhere": (k8s_wiring.service_reaches_vllm_port,
                               lambda m: _args(m.vllm("leader"), "--port=8000", "--port=8080")),
    "configmap-name-typo": (k8s_wiring.job_mounts_the_profile_configmap,
                            lambda m: m.job_pod()["volumes"][0]["configMap"].update(name="day0-profiles")),
    "profile-key-missing": (k8s_wiring.job_mounts_the_profile_configmap,
                            lambda m: m.configmap.update(data={"profile.toml": m.configmap["data"]["site.toml"]})),
    "reports-read-only": (k8s_wiring.job_mounts_the_profile_configmap,
                          lambda m: m.job_container()["volumeMounts"][1].update(readOnly=True)),
    "nnodes-not-size": (k8s_wiring.nnodes_is_the_group_size,
                        lambda m: _args(m.vllm("worker"), "--nnodes=$(LWS_GROUP_SIZE)", "--nnodes=3")),
    "workers-share-a-rank": (k8s_wiring.ranks_meet_at_the_leader,
                             lambda m: _args(m.vllm("worker"), "--node-rank=$(LWS_WORKER_INDEX)", "--node-rank=1")),
    "rendezvous-elsewhere": (k8s_wiring.ranks_meet_at_the_leader,
                             lambda m: _both(m, "--master-addr=$(LWS_LEADER_ADDRESS)", "--master-addr=localhost")),
    "worker-not-headless": (k8s_wiring.headless_only_on_workers,
                            lambda m: _args(m.vllm("worker"), "--headless", None)),
    "leader-headless": (k8s_wiring.headless_only_on_workers,
                        lambda m: m.vllm("leader")["args"].append("--headless")),
    "worker-serves-http": (k8s_wiring.headless_only_on_workers,
                           lambda m: m.vllm("worker")["args"].append("--port=8000")),
    "workers-other-context": (k8s_wiring.one_engine_on_every_pod,
                              lambda m: _args(m.vllm("worker"), "--max-model-len=1048576", "--max-model-len=131072")),
    "workers-fewer-gpus": (k8s_wiring.gpus_hold_the_parallel_layout,
                           lambda m: m.vllm("worker")["resources"]["limits"].update({"nvidia.com/gpu": 4})),
    "layout-over-more-gpus": (k8s_wiring.gpus_hold_the_parallel_layout,
                              lambda m: m.lws["spec"]["leaderWorkerTemplate"].update(size=8)),
    "leader-ready-deadlock": (k8s_wiring.workers_start_with_the_leader,
                              lambda m: m.lws["spec"].update(startupPolicy="LeaderReady")),
    "profile-other-nodes": (k8s_wiring.profile_describes_the_deployment,
                            lambda m: m.configmap["data"].update(
                                {"site.toml": m.configmap["data"]["site.toml"].replace("nodes = 4", "nodes = 2")})),
    "engine-other-kv-dtype": (k8s_wiring.profile_describes_the_deployment,
                              lambda m: _both(m, "--kv-cache-dtype=fp8", "--kv-cache-dtype=auto")),
    "served-name-differs": (k8s_wiring.profile_describes_the_deployment,
                            lambda m: _args(m.vllm("leader"), "--served-model-name=day0", "--served-model-name=m")),
    "job-reads-another-claim": (k8s_wiring.model_volume_is_shared,
                                lambda m: m.job_pod()["volumes"][2]["persistentVolumeClaim"].update(
                                    claimName="day0-model")),
    "job-key-other-secret": (k8s_wiring.api_key_comes_from_one_secret,
                             lambda m: _job_env(m).update(name="day0-key")),
    "vllm-image-drifted": (k8s_wiring.vllm_image_is_pyprojects,
                           lambda m: m.vllm("worker").update(image="vllm/vllm-openai:v0.31.0")),
}


@pytest.mark.parametrize("case", sorted(MISWIRED))
def test_a_wiring_check_fails_on_a_miswired_manifest(case: str, manifests: Manifests) -> None:
    check, breaks = MISWIRED[case]
    broken = copy.deepcopy(manifests)
    breaks(broken)
    with pytest.raises(AssertionError):
        check(broken)
    check(manifests)  # the deep copy left the real manifests as they were


def test_every_wiring_check_is_shown_to_fail() -> None:
    shown = {check for check, _ in MISWIRED.values()}
    assert [c.__name__ for c in CHECKS if c not in shown] == []
