"""The deployment files: the Kubernetes manifests validate, the Dockerfile's entrypoint and user.
(Sharding and merge through real runs: integration/test_scaleout.py.)"""

from __future__ import annotations

import orjson

from tests.harness import ROOT


def test_kubernetes_manifests_validate() -> None:
    import kubernetes_validate
    import yaml

    files = sorted((ROOT / "deploy" / "kubernetes").glob("*.yaml"))
    assert files
    for f in files:
        for doc in yaml.safe_load_all(f.read_text()):
            kubernetes_validate.validate(doc, "1.31.0", strict=True)
    job = yaml.safe_load((ROOT / "deploy" / "kubernetes" / "job.yaml").read_text())
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"]
    assert "backoffLimitPerIndex" in spec
    pod = spec["template"]["spec"]
    c = pod["containers"][0]
    assert c["resources"]["limits"]["memory"] == c["resources"]["requests"]["memory"]
    grace = float(c["args"][c["args"].index("--grace") + 1])
    assert pod["terminationGracePeriodSeconds"] > grace
    env = {e["name"]: e for e in c["env"]}
    assert env["EVALSUP_SHARDS"]["value"] == str(spec["completions"])
    assert "secretKeyRef" in env["OPENAI_API_KEY"]["valueFrom"]
    assert "--shard" in c["args"] and c["args"][c["args"].index("--shard") + 1] == "auto"


def test_dockerfile_entrypoint_and_user() -> None:
    lines = [x.strip() for x in (ROOT / "Dockerfile").read_text().splitlines() if x.strip() and not x.startswith("#")]
    instr = {x.split()[0]: x for x in lines}
    assert instr["FROM"].startswith("FROM python:3.11-slim")
    user = instr["USER"].split()[1]
    assert not user.startswith(("root", "0"))
    assert orjson.loads(instr["ENTRYPOINT"].split(None, 1)[1]) == ["evalsup"]  # exec form: signals reach it
    assert "apt-get" not in (ROOT / "Dockerfile").read_text()
    ignore = (ROOT / ".dockerignore").read_text().split()
    assert ".venv" in ignore and ".git" in ignore
