"""The Kubernetes example of `evalsup serve` (deploy/kubernetes/serve.yaml; every manifest there is validated
against the API schema by test_scaleout_manifests.py): one replica that never overlaps another on its volume,
readiness on /health, keys required since it listens beyond loopback, the volume mounted at --data."""

from __future__ import annotations

from typing import Any

from tests.harness import ROOT


def test_serve_deployment_one_owner_of_its_data() -> None:
    import yaml

    docs: dict[str, Any] = {d["kind"]: d for d in yaml.safe_load_all(
        (ROOT / "deploy" / "kubernetes" / "serve.yaml").read_text())}
    dep = docs["Deployment"]["spec"]
    assert dep["replicas"] == 1 and dep["strategy"]["type"] == "Recreate"
    pod = dep["template"]["spec"]
    c = pod["containers"][0]
    args = c["args"]
    assert args[0] == "serve" and "--api-keys" in args and args[args.index("--host") + 1] == "0.0.0.0"
    assert c["readinessProbe"]["httpGet"]["path"] == "/health"
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert mounts["data"] == args[args.index("--data") + 1]
    claim = next(v for v in pod["volumes"] if v["name"] == "data")["persistentVolumeClaim"]["claimName"]
    assert claim == docs["PersistentVolumeClaim"]["metadata"]["name"]
    assert docs["PersistentVolumeClaim"]["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert pod["terminationGracePeriodSeconds"] > 20  # the runs' --grace, then their checkpoint
    port = docs["Service"]["spec"]["ports"][0]["targetPort"]
    assert port in {p["name"] for p in c["ports"]}
