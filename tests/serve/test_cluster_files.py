"""examples/cluster (no docker here to run it): the compose file, the router
config and the Dockerfile parse and agree with each other and with
docs/api.md's "Several boards" — the same boards, ports, model path, images and
key placeholders."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ROOT / "examples" / "cluster"
BOARDS = ["board1", "board2", "board3"]


def _compose() -> dict:
    return yaml.safe_load((CLUSTER / "compose.yaml").read_text())


def _router_config() -> dict:
    return yaml.safe_load((CLUSTER / "litellm.yaml").read_text())


def _dockerfile_stages() -> dict[str, list[str]]:
    """Each stage's instructions (continuation lines joined, comments dropped), by stage name."""
    stages: dict[str, list[str]] = {}
    for line in re.sub(r"\\\n\s*", " ", (CLUSTER / "Dockerfile").read_text()).splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        m = re.match(r"FROM \S+ AS (\w+)$", line)
        if m:
            stages[m.group(1)] = []
        else:
            stages[list(stages)[-1]].append(line)
    return stages


def _docs_section() -> str:
    text = (ROOT / "docs" / "api.md").read_text()
    return text[text.index("## Several boards"):text.index("## Tests and bench")]


def _published(service: dict) -> tuple[int, int]:
    (mapping,) = service["ports"]
    host, container = mapping.split(":")
    return int(host), int(container)


def _bind(service: dict, suffix: str) -> dict:
    """The service's one bind mount whose target ends with `suffix`."""
    (mount,) = [v for v in service["volumes"] if isinstance(v, dict) and v["target"].endswith(suffix)]
    assert mount["type"] == "bind" and mount["read_only"] is True
    return mount


def _json_array(stage: list[str], keyword: str) -> list[str]:
    (line,) = [s for s in stage if s.startswith(keyword + " ")]
    return yaml.safe_load(line.removeprefix(keyword + " "))  # a JSON array is YAML


def test_router_config_names_the_boards_compose_maps():
    compose, config = _compose(), _router_config()
    board_port = _published(compose["services"]["board"])[0]
    deployments = config["model_list"]
    assert [d["litellm_params"]["api_base"] for d in deployments] == \
        [f"http://{b}:{board_port}/v1" for b in BOARDS]
    assert compose["services"]["router"]["network_mode"] == "host"  # the host's /etc/hosts names the boards
    # one model name for clients; each board's model id is the mounted rkbin's name without .rkbin
    served = Path(_bind(compose["services"]["board"], ".rkbin")["target"]).stem
    assert {d["model_name"] for d in deployments} == {"rkc"}
    assert {d["litellm_params"]["model"] for d in deployments} == {f"openai/{served}"}
    # what the docs promise of the router: retries, cooldown, health checks, session affinity, a key
    settings = config["router_settings"]
    assert settings["num_retries"] >= len(BOARDS) - 1 and settings["enable_health_check_routing"] is True
    assert "session_affinity" in settings["optional_pre_call_checks"]
    assert config["general_settings"]["background_health_checks"] is True
    # a busy board's 503 does not cool it down; with that policy set, LiteLLM filters by the probes only for the
    # groups named in background_health_check_model_groups
    assert settings["allowed_fails_policy"]["ServiceUnavailableErrorAllowedFails"] >= 1000
    assert config["general_settings"]["background_health_check_model_groups"] == ["rkc"]
    assert config["general_settings"]["master_key"] == "os.environ/LITELLM_MASTER_KEY"
    assert all(d["model_info"]["health_check_max_tokens"] == 1 for d in deployments)


def test_compose_runs_the_dockerfile_stages_on_the_board_npu():
    compose, stages = _compose(), _dockerfile_stages()
    board, router = compose["services"]["board"], compose["services"]["router"]
    assert board["platform"] == "linux/arm64" and "/dev/accel/accel0:/dev/accel/accel0" in board["devices"]
    for service, stage in ((board, "board"), (router, "router")):
        build = service["build"]
        assert (CLUSTER / build["context"] / build["dockerfile"]).resolve() == CLUSTER / "Dockerfile"
        assert build["target"] == stage and stage in stages
    # the board image serves the mounted rkbin on the published port, on the NPU
    cmd = _json_array(stages["board"], "CMD")
    assert cmd[0] == _bind(board, ".rkbin")["target"] and _json_array(stages["board"], "ENTRYPOINT") == ["rkrun", "serve"]
    assert cmd[cmd.index("--port") + 1] == str(_published(board)[1]) and cmd[cmd.index("--device") + 1] == "rocket"
    assert cmd[cmd.index("--host") + 1] == "0.0.0.0"
    # the board image installs the whole package: every folder setup.py maps into rkc
    setup_py = (ROOT / "setup.py").read_text()
    folders = ["rkc", *re.search(r"SUBPACKAGES = \(([^)]*)\)", setup_py).group(1).replace('"', "").split(", ")]
    copied = {source for line in stages["board"] if line.startswith("COPY ") for source in line.split()[1:-1]}
    assert set(folders) | {"pyproject.toml", "setup.py", "README.md"} <= copied  # what pip builds rkc from
    # the router image: the config where compose mounts it, on the published port
    rcmd = _json_array(stages["router"], "CMD")
    config_mount = _bind(router, ".yaml")
    assert (CLUSTER / config_mount["source"]).resolve() == CLUSTER / "litellm.yaml"
    assert rcmd[rcmd.index("--config") + 1] == config_mount["target"]
    assert "LITELLM_MASTER_KEY" in router["environment"] and "ports" not in router  # host network: no mapping
    # compose interpolates every service whatever the profile: a required variable would stop the other profile
    uses = re.findall(r"\$\{(\w+)(:?[-?+])", (CLUSTER / "compose.yaml").read_text())
    assert uses and all(op == ":-" for _, op in uses), uses


def test_router_image_pins_a_version_of_the_cluster_extra():
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["cluster"]
    (wanted,) = [Requirement(r) for r in extra if Requirement(r).name == "litellm"]
    (pin,) = re.findall(r'"litellm\[proxy\]==([\d.]+)"', "\n".join(_dockerfile_stages()["router"]))
    assert wanted.specifier.contains(pin) and "proxy" in wanted.extras


def test_docs_give_the_same_setup():
    docs, compose = _docs_section(), _compose()
    for name in ("Dockerfile", "compose.yaml", "litellm.yaml"):
        assert f"(../examples/cluster/{name})" in docs
    assert all(b in docs for b in BOARDS)
    board_port = _published(compose["services"]["board"])[0]
    rcmd = _json_array(_dockerfile_stages()["router"], "CMD")
    router_port = int(rcmd[rcmd.index("--port") + 1])
    assert f"rkrun serve model.rkbin --host 0.0.0.0 --port {board_port}" in docs
    assert f"--port {router_port}" in docs and f"http://router:{router_port}/v1" in docs
    for profile in ("board", "router"):
        assert f"docker compose -f examples/cluster/compose.yaml --profile {profile} up -d" in docs
    pin = re.search(r'litellm\[proxy\]==[\d.]+', (CLUSTER / "Dockerfile").read_text()).group(0)
    assert pin in docs
    # the API key placeholder, commented out in both files until rkrun serve takes --api-key
    assert "# api_key: os.environ/RKC_API_KEY" in (CLUSTER / "litellm.yaml").read_text()
    compose_text = (CLUSTER / "compose.yaml").read_text()
    assert compose_text.count("#   RKC_API_KEY: ${RKC_API_KEY:-}") == 1  # the boards'
    assert compose_text.count("# RKC_API_KEY: ${RKC_API_KEY:-}") == 1  # the router's
    assert "RKC_API_KEY" in docs
