"""The Makefile's hand-over of pip's configuration to uv (``UV_ARGS_PY``): what pip would install
from, uv must install from too, and a setting uv cannot take must send the install to pip."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

MAKEFILE = Path(__file__).resolve().parents[1] / "Makefile"


def _script() -> str:
    m = re.search(r"^define UV_ARGS_PY\n(.*?)^endef$", MAKEFILE.read_text(), re.S | re.M)
    assert m, "Makefile: no UV_ARGS_PY definition"
    return m.group(1)


def _uv_args(tmp_path, config: str | None = None, **pip_env) -> subprocess.CompletedProcess:
    """Run the script with only ``pip_env`` (PIP_* variables) and ``config`` (a pip.conf text, or
    no configuration file at all) as pip's configuration."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["HOME"] = str(tmp_path)             # no user configuration
    conf = tmp_path / "pip.conf"
    conf.write_text(config or "")
    env["PIP_CONFIG_FILE"] = str(conf) if config else os.devnull
    env.update(pip_env)
    return subprocess.run([sys.executable, "-c", _script()], capture_output=True, text=True,
                          env=env)


def _args(proc) -> list[str]:
    assert proc.returncode == 0, proc.stderr
    return shlex.split(proc.stdout)


def test_no_pip_configuration_gives_pips_version_rule_only(tmp_path):
    assert _args(_uv_args(tmp_path)) == ["--index-strategy", "unsafe-best-match"]


def test_pip_settings_that_decide_what_is_installed_reach_uv(tmp_path):
    links = tmp_path / "wheels"
    links.mkdir()
    args = _args(_uv_args(tmp_path, PIP_INDEX_URL="http://mirror.example/simple",
                          PIP_CONSTRAINT="/pins a.txt", PIP_FIND_LINKS=f"{links} {tmp_path / 'nope'}",
                          PIP_EXTRA_INDEX_URL=f"file://{tmp_path / 'gone'} http://extra.example/simple",
                          PIP_TRUSTED_HOST="mirror.example", PIP_DEFAULT_TIMEOUT="60"))
    pairs = list(zip(args[::2], args[1::2]))
    assert ("--index-url", "http://mirror.example/simple") in pairs
    assert ("--constraint", "/pins") in pairs and ("--constraint", "a.txt") in pairs  # pip splits too
    assert ("--find-links", str(links)) in pairs
    assert ("--extra-index-url", "http://extra.example/simple") in pairs
    assert ("--allow-insecure-host", "mirror.example") in pairs
    # a local source that is not there is skipped, as pip skips it
    assert not any("nope" in a or "gone" in a for a in args)


def test_environment_overrides_the_configuration_file_as_in_pip(tmp_path):
    conf = "[global]\nconstraint = /from-file.txt\nindex-url = http://file.example/simple\n"
    args = _args(_uv_args(tmp_path, conf, PIP_CONSTRAINT="/from-env.txt"))
    assert "/from-env.txt" in args and "/from-file.txt" not in args
    assert "http://file.example/simple" in args      # not overridden: kept
    # [install] over [global] whatever order pip lists them in (pip versions differ)
    inst = "[install]\nconstraint = /i.txt\n[global]\nconstraint = /g.txt\n"
    args = _args(_uv_args(tmp_path, inst))
    assert "/i.txt" in args and "/g.txt" not in args


@pytest.mark.parametrize("env", [{"PIP_PRE": "1"}, {"PIP_NO_BINARY": ":all:"}])
def test_a_pip_setting_uv_cannot_take_sends_the_install_to_pip(tmp_path, env):
    proc = _uv_args(tmp_path, **env)
    key = next(iter(env))[4:].lower().replace("_", "-")
    assert proc.returncode != 0 and repr(key) in proc.stderr


def test_precedence_does_not_depend_on_the_order_pip_lists_settings_in(tmp_path):
    # pip 23 lists PIP_* variables first (sorted), pip 26 last: a stand-in ``pip`` prints the
    # first order; the variable must still win over the files, [install] over [global]
    fake = tmp_path / "fake" / "pip"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "__main__.py").write_text(
        "print(\":env:.constraint='/env.txt'\")\n"
        "print(\"global.constraint='/global.txt'\")\n"
        "print(\"install.index-url='http://install.example/simple'\")\n"
        "print(\"global.index-url='http://global.example/simple'\")\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "fake")}
    proc = subprocess.run([sys.executable, "-c", _script()], capture_output=True, text=True, env=env)
    args = _args(proc)
    assert args == ["--index-strategy", "unsafe-best-match", "--constraint", "/env.txt",
                    "--index-url", "http://install.example/simple"]
