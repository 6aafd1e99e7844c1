"""The notebooks as files: kernel "Python (btb)", saved as JupyterLab saves them (so opening one
leaves git clean), no outputs, and a first cell that says which size it shows and how to switch."""

from __future__ import annotations

import ast
import json
import os
from pathlib import Path

import pytest
import yaml

import nbformat

from btb_core.notebooks import FULL_PARAMS, INTERRUPTED_CELL_ID, KERNEL_NAME, _mark_interrupted, \
    size_parameters
from btb_core.paths import REPO_ROOT

NOTEBOOKS = sorted((REPO_ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
FULL = yaml.safe_load(FULL_PARAMS.read_text())


def _code(cell) -> str:
    return "".join(cell["source"])


def test_every_notebook_is_listed():
    assert [nb.stem[:2] for nb in NOTEBOOKS] == [f"{i:02d}" for i in range(len(NOTEBOOKS))]
    assert len(NOTEBOOKS) >= 8
    assert set(FULL) <= {nb.stem for nb in NOTEBOOKS}, "full.yaml names a notebook that does not exist"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_kernel_and_lab_serialisation(path):
    raw = path.read_text()
    nb = json.loads(raw)
    assert nb["metadata"]["kernelspec"] == {"display_name": "Python (btb)", "language": "python",
                                             "name": KERNEL_NAME}
    # the language_info JupyterLab fills in on open: present, so saving does not add it
    assert nb["metadata"]["language_info"].get("codemirror_mode") == {"name": "ipython", "version": 3}
    # JupyterLab's serialisation: sorted keys, one-space indent, sources as lists of lines
    assert raw == json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n"
    for cell in nb["cells"]:
        assert isinstance(cell["source"], list) and "id" in cell
        if cell["cell_type"] == "code":
            assert cell["outputs"] == [] and cell["execution_count"] is None, "outputs committed"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_first_cell_says_size_and_how_to_switch(path):
    cells = json.loads(path.read_text())["cells"]
    intro = "".join(cells[0]["source"])
    assert cells[0]["cell_type"] == "markdown" and "**Size.**" in intro
    assert 'size = "full"' in intro and "notebooks/params/full.yaml" in intro
    params = cells[1]
    assert "parameters" in params["metadata"].get("tags", [])
    tree = ast.parse(_code(params))
    names = {t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets
             if isinstance(t, ast.Name)}
    names |= {e.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets
              if isinstance(t, ast.Tuple) for e in t.elts}
    assert "size" in names and 'size = "quick"' in _code(params)
    # every full-size value is a parameter of the notebook (a typo would be silently ignored)
    assert set(FULL.get(path.stem, {})) <= names, set(FULL.get(path.stem, {})) - names
    # the switch is applied before anything uses the parameters
    switch = f'globals().update(size_parameters(size, "{path.stem}"))'
    assert switch in _code(cells[2]), f"{path.name}: cell 3 must apply the size switch"


def test_size_parameters():
    assert size_parameters("quick", "04_btb_replay") == {}
    assert size_parameters("full", "03_routers_under_bursts") == FULL["03_routers_under_bursts"]
    from btb_core.errors import ConfigError

    with pytest.raises(ConfigError, match="quick"):
        size_parameters("large", "04_btb_replay")


@pytest.mark.parametrize("text, match", [
    ("00_prefill_vs_transfer:\n  compare_setup: [x]\n", "00_prefill_vs_transfer: unknown parameter 'compare_setup'"),
    ("00_prefil_vs_transfer: {}\n", "unknown notebook '00_prefil_vs_transfer'"),
    ("a: [1\n", "not valid YAML (line 2)"),
    ("00_prefill_vs_transfer: [1, 2]\n", "expected a mapping of parameter -> value, got list"),
    ("- 1\n", "expected a mapping of notebook name -> parameters, got list"),
])
def test_params_file_mistakes_are_one_line_errors(tmp_path, capsys, text, match):
    # a typo in a parameters file must not run a notebook at its defaults without a word
    from btb_core.notebooks import main

    f = tmp_path / "p.yaml"
    f.write_text(text)
    assert main(["--params", str(f), "--out", str(tmp_path / "out"), "--only", "00"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and match in err[0] and str(f) in err[0]
    assert not (tmp_path / "out").exists()


def test_full_params_file_passes_the_check_and_only_must_match(tmp_path, capsys):
    from btb_core.notebooks import load_params, main
    from btb_core.paths import REPO_ROOT

    nbs = sorted((REPO_ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    assert sorted(load_params(FULL_PARAMS, nbs)) == [nb.stem for nb in nbs]
    assert main(["--only", "99", "--out", str(tmp_path)]) == 2
    assert "--only 99: no notebook matches" in capsys.readouterr().err
    assert main(["--params", str(tmp_path / "none.yaml"), "--out", str(tmp_path)]) == 2
    assert "cannot read the parameters file" in capsys.readouterr().err


def test_notebooks_not_in_the_params_file_write_quick_figures(tmp_path, monkeypatch):
    # a partial parameters file of the user's: the listed notebook's figures go beside its
    # executed notebooks (<out>/figures), the others run at quick defaults; neither may overwrite
    # the shipped full-size figures, which only the shipped parameters write
    import btb_core.notebooks as runner
    from btb_core.paths import REPO_ROOT

    monkeypatch.delenv("BTB_FIGURES_DIR", raising=False)
    monkeypatch.delenv("_BTB_FIGURES_AUTO", raising=False)
    seen = {}

    def fake_serial(notebooks, params, out_dir, quiet, figures_for=None):
        seen.update({nb.stem: figures_for(nb.stem) for nb in notebooks})
        return 0

    monkeypatch.setattr(runner, "_run_serial", fake_serial)
    f = tmp_path / "p.yaml"
    f.write_text("00_prefill_vs_transfer: {curve_points: 10}\n")
    assert runner.run_all(f, tmp_path / "out", only=["00", "01"]) == 0
    assert seen == {"00_prefill_vs_transfer": str((tmp_path / "out" / "figures").resolve()),
                    "01_trace_audit": str(REPO_ROOT / "build" / "figures-quick")}
    assert "BTB_FIGURES_DIR" not in os.environ and "_BTB_FIGURES_AUTO" not in os.environ
    seen.clear()
    assert runner.run_all(FULL_PARAMS, tmp_path / "out", only=["00"]) == 0   # make reproduce
    assert seen == {"00_prefill_vs_transfer": str(REPO_ROOT / "figures")}


def _children(pid: int) -> list[int]:
    """Direct children of ``pid`` (from /proc)."""
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                fields = (p / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append(int(p.name))
    return out


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_a_stopped_notebook_copy_says_where_it_stopped(tmp_path):
    # papermill ends a stopped run with every cell it had not reached marked "completed"
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# title")]
    for i, status in enumerate(["completed", "completed", "running", "completed", "completed"]):
        c = nbformat.v4.new_code_cell(f"x = {i}")
        c.metadata["papermill"] = {"status": status, "exception": False,
                                   "start_time": None if i > 2 else "2026-12-02T10:00:00"}
        c.execution_count = i + 1 if i < 2 else None
        nb.cells.append(c)
    nb.metadata["papermill"] = {"exception": None}
    path = tmp_path / "nb.ipynb"
    nbformat.write(nb, str(path))
    _mark_interrupted(path)
    _mark_interrupted(path)                   # twice: still one note
    out = nbformat.read(str(path), as_version=4)
    assert [c.id for c in out.cells].count(INTERRUPTED_CELL_ID) == 1
    assert out.cells[0].id == INTERRUPTED_CELL_ID and "at code cell 3:" in out.cells[0].source
    assert [c.metadata["papermill"]["status"] for c in out.cells if c.cell_type == "code"] == [
        "completed", "completed", "failed", "pending", "pending"]
    assert out.metadata.papermill.exception is True
    assert not list(tmp_path.glob("*.tmp"))
    # the stop came while a cell ran and its kernel was interrupted: papermill marked it
    # "completed" with a KeyboardInterrupt in its outputs
    nb.cells[3].metadata["papermill"]["status"] = "completed"
    nb.cells[3].execution_count = 3
    nb.cells[3].outputs = [nbformat.v4.new_output("error", ename="KeyboardInterrupt", evalue="",
                                                  traceback=[])]
    nbformat.write(nb, str(path))
    _mark_interrupted(path)
    out = nbformat.read(str(path), as_version=4)
    assert "at code cell 3:" in out.cells[0].source
    assert [c.metadata["papermill"]["status"] for c in out.cells if c.cell_type == "code"] == [
        "completed", "completed", "failed", "pending", "pending"]
    (tmp_path / "broken.ipynb").write_text("{not json")
    _mark_interrupted(tmp_path / "broken.ipynb")          # unreadable: left as it is
    assert (tmp_path / "broken.ipynb").read_text() == "{not json"


def test_kernel_connection_files_live_in_the_socket_folder(tmp_path):
    # jupyter_client's default connection file, in the temp folder, was left behind by every
    # stopped kernel; beside the IPC sockets it goes with their folder
    from btb_core.notebooks import _ipc_kernel_manager

    km = _ipc_kernel_manager(str(tmp_path))(kernel_name=KERNEL_NAME)
    assert Path(km.connection_file).parent == tmp_path
    assert Path(km.ip).parent == tmp_path and km.transport == "ipc"


def test_sigterm_stops_every_notebook_still_running(tmp_path):
    # each notebook of a --jobs run has a session of its own, so a SIGTERM to the runner alone
    # (a CI time limit, `timeout`) used to leave them and their kernels running; the runner now
    # unwinds on SIGTERM as on Ctrl-C and stops them
    import signal
    import subprocess
    import sys
    import time

    from btb_core.paths import REPO_ROOT

    proc = subprocess.Popen([sys.executable, "-m", "btb_core.notebooks", "--only", "00", "01",
                             "--jobs", "2", "--out", str(tmp_path)], cwd=REPO_ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    kernels: list[int] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(kernels) < 2:
        time.sleep(0.2)
        kernels = [k for child in _children(proc.pid) for k in _children(child)]
    assert len(kernels) == 2, "the two notebooks' kernels did not start"
    copies = [tmp_path / "00_prefill_vs_transfer.ipynb", tmp_path / "01_trace_audit.ipynb"]
    while time.monotonic() < deadline and not all(p.exists() for p in copies):
        time.sleep(0.2)                       # papermill saves each copy when it starts
    everyone = _children(proc.pid) + kernels
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    err = proc.stdout.read().decode()         # the notebooks' own output passes through it
    assert err.count("terminated (the notebooks still running were stopped)") == 1, err   # once
    assert "Traceback" not in err, err        # the stopped kernels' ZMQ complaints are dropped
    for copy in copies:                       # each executed copy says it was stopped
        nb = nbformat.read(str(copy), as_version=4)
        assert nb.cells[0].id == INTERRUPTED_CELL_ID and "was stopped" in nb.cells[0].source
        assert nb.metadata.papermill.exception is True
        last = [c for c in nb.cells if c.cell_type == "code"][-1]
        assert last.metadata.papermill.status == "pending" and last.execution_count is None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in everyone):
        time.sleep(0.2)
    alive = [p for p in everyone if Path(f"/proc/{p}/stat").exists()
             and (Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z")]
    assert not alive, f"left running: {alive}"


def test_make_reproduce_draws_notebook_07_from_the_shipped_run():
    # with the engine installed (after make test) notebook 07 would measure anew at full size for
    # ~13 minutes and overwrite the shipped figures/07_*: make reproduce must not
    params = yaml.safe_load(FULL_PARAMS.read_text())
    assert params["07_real_engine"]["use_engine"] is False
