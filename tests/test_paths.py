"""Paths work for a non-editable install: the package outside a checkout finds the shipped data
where the wheel installs them (``[tool.setuptools.data-files]``), and the table lists every file."""

from __future__ import annotations

import shutil
import site
import subprocess
import sys
import tomllib
from pathlib import Path

from btb_core.paths import DATA_DIR, IN_CHECKOUT, REPO_ROOT

ROOT = Path(__file__).resolve().parents[1]


def _data_files_table() -> dict[str, list[str]]:
    with open(ROOT / "pyproject.toml", "rb") as fh:
        return tomllib.load(fh)["tool"]["setuptools"]["data-files"]


def test_checkout_layout():
    assert IN_CHECKOUT and REPO_ROOT == ROOT and DATA_DIR == ROOT / "data"


def test_wheel_data_files_list_every_shipped_file():
    listed = {f for files in _data_files_table().values() for f in files}
    shipped = {p.relative_to(ROOT).as_posix() for p in (ROOT / "data").rglob("*") if p.is_file()}
    assert listed == shipped
    for dest, files in _data_files_table().items():
        for f in files:   # each file lands in share/btb_core/<its folder>
            assert dest == "share/btb_core/" + Path(f).parent.as_posix()


def test_installed_layout_finds_data_under_the_prefix(tmp_path):
    # an environment whose prefix holds the wheel's data files, and the package outside a checkout
    prefix = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(prefix)], check=True)
    for dest, files in _data_files_table().items():
        for f in files:
            target = prefix / dest / Path(f).name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(ROOT / f, target)
    pkgs = tmp_path / "site"
    shutil.copytree(ROOT / "btb_core", pkgs / "btb_core",
                    ignore=shutil.ignore_patterns("__pycache__"))
    python = prefix / ("Scripts/python.exe" if sys.platform == "win32" else "bin/python")
    code = ("from btb_core.paths import DATA_DIR, IN_CHECKOUT, REPO_ROOT; "
            "from btb_core.trace import load_mooncake; "
            "from btb_core.anchors import PROFILES_DIR; "
            "t = load_mooncake(DATA_DIR / 'traces' / 'mooncake' / 'conversation_trace.jsonl'); "
            "print(IN_CHECKOUT, DATA_DIR, REPO_ROOT, len(t), PROFILES_DIR.is_dir())")
    env = {"PYTHONPATH": f"{pkgs}:{':'.join(site.getsitepackages())}", "HOME": str(tmp_path),
           "PATH": "/usr/bin:/bin"}
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, env=env,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    in_checkout, data_dir, repo_root, rows, profiles = out.stdout.split()
    assert in_checkout == "False"
    assert Path(data_dir) == (prefix / "share" / "btb_core" / "data").resolve()
    assert Path(repo_root) == (tmp_path / ".btb").resolve()
    assert rows == "12031" and profiles == "True"
