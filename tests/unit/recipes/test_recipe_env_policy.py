"""recipes/vllm-args/launch-env.yaml as data: a pin's own additions allow a name for that pin only; a project without
the file allows no name (fails closed); a malformed file is a clear error. A copy of the project's data, named with
--project, read by the real CLI."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from g4build.cli import main
from g4build.recipes.env_policy import POLICY_FILE, load_env_policy

REPO = Path(__file__).resolve().parents[3]
RECIPE = "gemma4-26b-a4b-nvfp4-baseline"


def _project(tmp_path: Path) -> Path:
    top = tmp_path / "project"
    shutil.copytree(REPO / "patches", top / "patches")
    shutil.copytree(REPO / "recipes", top / "recipes")
    return top


def _check(top: Path, capsys: pytest.CaptureFixture[str], *sets: str) -> tuple[int, str]:
    """``recipe check`` with each ``KEY=VALUE`` as --set; ``--allow-env NAME`` pairs passed as they are."""
    argv = ["--project", str(top), "recipe", "check", RECIPE]
    items = iter(sets)
    for item in items:
        argv += [item, next(items)] if item == "--allow-env" else ["--set", item]
    try:
        main(argv)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_a_pins_own_names_are_allowed_for_that_pin_only(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    top = _project(tmp_path)
    policy = top / "recipes" / POLICY_FILE
    text = policy.read_text(encoding="utf-8")
    assert "\npins: {}\n" in text
    policy.write_text(text.replace("\npins: {}\n", "\npins:\n  vllm-0.21.0: {names: [MY_PIN_VAR]}\n"),
                      encoding="utf-8")
    code, out = _check(top, capsys, "env.MY_PIN_VAR=1")
    assert code == 0 and "env-allowed" not in out, out
    code, out = _check(top, capsys, "env.MY_PIN_VAR=1", "pin=vllm-0.33.0")
    assert code == 11 and "env MY_PIN_VAR: refused" in out, out


def test_a_project_without_the_file_allows_no_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    top = _project(tmp_path)
    (top / "recipes" / POLICY_FILE).unlink()
    code, out = _check(top, capsys)
    assert code == 11 and "env VLLM_ALLOW_LONG_MAX_MODEL_LEN: refused" in out and "absent" in out, out


def test_a_malformed_policy_is_a_config_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    top = _project(tmp_path)
    (top / "recipes" / POLICY_FILE).write_text("allow:\n  prefixes: [VLLM_, 'not a name']\n", encoding="utf-8")
    code, out = _check(top, capsys)
    assert code == 3 and "allow.prefixes" in out, out


# --- the deny-list holds a class: what makes the launch run code or turn off a check -------------------------

# each is refused as *denied* (never merely "not allowed": --allow-env does not open it), in any case
CODE_OR_CHECKS = ("TRITON_PTXAS_PATH", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "VLLM_CACHE_ROOT",
                  "HF_MODULES_CACHE", "NCCL_CONF_FILE", "VLLM_ALLOW_INSECURE_SERIALIZATION", "HF_ENDPOINT",
                  "G4BUILD_ALLOW_ENVIRONMENT", "CUDA_HOME", "TORCH_EXTENSIONS_DIR", "VLLM_NCCL_SO_PATH",
                  "TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE", "FLASHINFER_WORKSPACE_BASE", "TRITON_CACHE_MANAGER",
                  "VLLM_PLUGINS", "VLLM_RUST_FRONTEND_PATH", "HF_HOME", "Path", "ld_preload")


@pytest.mark.parametrize("name", CODE_OR_CHECKS)
def test_the_shipped_policy_denies_names_that_run_code_or_turn_off_checks(name: str) -> None:
    policy = load_env_policy(REPO / "recipes")
    for spelled in (name, name.lower(), name.upper(), name.capitalize()):
        assert policy.verdict(spelled, "vllm-0.21.0", frozenset({spelled.upper()})) == "denied", spelled


@pytest.mark.parametrize("name", ["VLLM_ALLOW_LONG_MAX_MODEL_LEN", "PYTORCH_CUDA_ALLOC_CONF", "NCCL_DEBUG",
                                  "CUDA_VISIBLE_DEVICES", "vllm_use_flashinfer_sampler", "Omp_Num_Threads"])
def test_the_shipped_policy_allows_what_recipes_set_in_any_case(name: str) -> None:
    assert load_env_policy(REPO / "recipes").verdict(name, None, frozenset()) == "allowed"


@pytest.mark.parametrize("name", ["TRITON_PTXAS_PATH", "HF_ENDPOINT", "G4BUILD_ALLOW_ENVIRONMENT",
                                  "VLLM_ALLOW_INSECURE_SERIALIZATION", "Path", "path"])
def test_set_env_of_a_denied_name_is_refused_as_denied_even_with_allow_env(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str) -> None:
    top = _project(tmp_path)
    code, out = _check(top, capsys, f"env.{name}=x")
    assert code == 11 and f"env {name}: refused: a launch script never sets it" in out, out
    assert "deny-list of" in out and "allow-list of" not in out, out
    code, out = _check(top, capsys, f"env.{name}=x", "--allow-env", name.lower())
    assert code == 11 and "even with --allow-env" in out, out


def test_allow_env_takes_a_name_in_any_case(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    top = _project(tmp_path)
    code, out = _check(top, capsys, "env.MY_SITE_TAG=rack-7")
    assert code == 11 and "allow-list of" in out, out
    for asked in ("my_site_tag", "My_Site_Tag"):
        code, out = _check(top, capsys, "env.MY_SITE_TAG=rack-7", "--allow-env", asked)
        assert code == 0 and "set because the command line said --allow-env MY_SITE_TAG" in out, out


def test_lower_case_entries_in_the_policy_file_count(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    top = _project(tmp_path)
    policy = top / "recipes" / POLICY_FILE
    policy.write_text(policy.read_text(encoding="utf-8").replace(
        "\npins: {}\n", "\npins:\n  vllm-0.21.0: {prefixes: [site_], names: [my_tag]}\n"), encoding="utf-8")
    text = policy.read_text(encoding="utf-8")
    policy.write_text(text.replace("contains: [INSECURE, REMOTE]", "contains: [insecure, remote, secret]"),
                      encoding="utf-8")
    assert "secret]" in policy.read_text(encoding="utf-8")
    for allowed in ("env.MY_TAG=1", "env.SITE_RACK=7"):
        code, out = _check(top, capsys, allowed)
        assert code == 0 and "env-allowed" not in out, out
    code, out = _check(top, capsys, "env.SITE_SECRET_KEY=1")
    assert code == 11 and "env SITE_SECRET_KEY: refused" in out and "deny-list of" in out, out


@pytest.mark.parametrize(("old", "new", "said"), [
    ("\ndeny:\n", "\ndeney:\n", "unknown key 'deney'"),
    ("\n  suffixes: [", "\n  sufixes: [", "unknown key 'sufixes'"),
    ("\npins: {}\n", "\npins: {}\npin: {}\n", "unknown key 'pin'"),
    ("\npins: {}\n", "\npins: {vllm-0.21.O: {names: [MY_VAR]}}\n", "unknown key 'vllm-0.21.O'"),
])
def test_a_misspelled_key_in_the_policy_is_an_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], old: str, new: str, said: str) -> None:
    """Ignored, `deney:` would deny nothing: BASH_ENV in a recipe would pass."""
    top = _project(tmp_path)
    policy = top / "recipes" / POLICY_FILE
    text = policy.read_text(encoding="utf-8")
    assert text.count(old) == 1
    policy.write_text(text.replace(old, new), encoding="utf-8")
    code, out = _check(top, capsys, "env.BASH_ENV=/tmp/x")
    assert code == 3 and said in out and "did you mean" in out, out


def test_two_spellings_of_one_variable_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Windows has one variable for both: which value wins would depend on the order the script sets them."""
    top = _project(tmp_path)
    code, out = _check(top, capsys, "env.vllm_allow_long_max_model_len=0")
    assert code == 2 and "'VLLM_ALLOW_LONG_MAX_MODEL_LEN' and 'vllm_allow_long_max_model_len' name one" in out, out


def test_a_vllm_name_in_another_case_is_named_by_its_spelling(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """On Linux `vllm_logging_level` is another variable, which vLLM never reads."""
    top = _project(tmp_path)
    code, out = _check(top, capsys, "env.vllm_logging_level=DEBUG")
    assert code == 11 and "env vllm_logging_level: vLLM 0.21.0 reads VLLM_LOGGING_LEVEL" in out, out
    code, out = _check(top, capsys, "env.VLLM_LOGGING_LEVEL=DEBUG")
    assert code == 0, out


def test_an_allowed_name_in_another_case_is_named_by_its_spelling(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Allowed (Windows reads `nccl_debug` as NCCL_DEBUG), but NCCL on Linux never reads it: said, with the fix."""
    top = _project(tmp_path)
    code, out = _check(top, capsys, "env.nccl_debug=INFO")
    assert code == 0 and "env nccl_debug: the programs that read it spell it NCCL_DEBUG" in out, out
    code, out = _check(top, capsys, "env.NCCL_DEBUG=INFO")
    assert code == 0 and "env-allowed" not in out, out
