"""What Ansible's tools and a package index read: the collection's requirements.txt, bindep.txt
and meta/execution-environment.yml (checked with ansible-builder, bindep and ansible-galaxy
themselves), the wheel's metadata (twine check) and its collection (ansible-galaxy verify).
No network."""

from __future__ import annotations

import ast
import email
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from driver import paths

REPO = paths.CHECKOUT
COLLECTION = REPO / "collection" / "ansible_collections" / "torchherd" / "cluster"
PREFIX = "ansible_collections.torchherd.cluster."
BIN = Path(sys.executable).parent
# Plugin directories whose code runs on the nodes; everything else under plugins/ runs on the
# controller (and pulls in the module_utils it imports).
NODE_SIDE = {"modules", "module_utils"}
# Imports in a module the controller imports that run elsewhere all the same: (file, module) to
# why. Nothing else may be left out of requirements.txt.
RUN_ELSEWHERE = {
    ("plugins/module_utils/_interconnect.py", "torch"):
        "measure() runs in the job's interpreter on the nodes; the controller imports judge()",
}


def _env(tmp_path: Path) -> dict[str, str]:
    """Ansible's tools with nothing of this checkout's or the user's configuration."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    return {**env, "HOME": str(tmp_path / "home"), "ANSIBLE_HOME": str(tmp_path / "ansible-home")}


def _run(argv: list, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    done = subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, (argv, done.stdout[-2000:], done.stderr[-3000:])
    return done


def _requirements() -> dict[str, Requirement]:
    lines = (COLLECTION / "requirements.txt").read_text().splitlines()
    reqs = [Requirement(line.split("#", 1)[0]) for line in lines
            if line.split("#", 1)[0].strip()]
    return {canonicalize_name(r.name): r for r in reqs}


# --- requirements.txt: what the controller-side plugins import ---------------------------------

def _module_file(dotted: str) -> Path | None:
    """The collection's file for ansible_collections.torchherd.cluster.<dotted>, if any."""
    base = COLLECTION.joinpath(*dotted[len(PREFIX):].split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def controller_imports(plugins: Path = COLLECTION / "plugins") -> dict[str, set[str]]:
    """Top-level modules imported (anywhere in a file, lazily too) by the controller-side plugins
    and by every collection module they import in turn: module name to the files importing it."""
    todo = [p for p in plugins.rglob("*.py")
            if p.relative_to(plugins).parts[0] not in NODE_SIDE]
    seen: set[Path] = set()
    found: dict[str, set[str]] = {}
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            else:
                assert not isinstance(node, ast.ImportFrom), f"{path}: a relative import"
                continue
            for name in names:
                if name.startswith(PREFIX):
                    if (target := _module_file(name)) is not None:
                        todo.append(target)
                else:
                    where = path.relative_to(COLLECTION if path.is_relative_to(COLLECTION)
                                             else plugins.parent)
                    found.setdefault(name.split(".")[0], set()).add(str(where))
    return found


def _third_party(imports: dict[str, set[str]]) -> dict[str, set[str]]:
    ours = {"__future__", "ansible", "ansible_collections"}
    found = {m: {f for f in files if (f, m) not in RUN_ELSEWHERE}
             for m, files in imports.items() if m not in sys.stdlib_module_names | ours}
    return {m: files for m, files in found.items() if files}


def _ansible_core_brings() -> set[str]:
    """ansible-core and the distributions it requires itself (PyYAML, Jinja2, ...)."""
    requires = importlib.metadata.requires("ansible-core") or []
    return {canonicalize_name("ansible-core")} | {
        canonicalize_name(Requirement(r).name) for r in requires if "extra ==" not in r}


def test_the_import_walk_reaches_module_utils():
    """The check below sees a lazy import in module_utils that an action plugin uses:
    pathspec, which module_utils/_codehash.py imports inside a function for action/code_hash."""
    found = controller_imports()
    assert "plugins/module_utils/_codehash.py" in found["pathspec"]
    assert "yaml" in found and "pathspec" in found
    assert not any(f.startswith("plugins/modules/") for f in set().union(*found.values()))
    for file, module in RUN_ELSEWHERE:  # an entry no longer needed goes
        assert file in found.get(module, set()), (file, module)


def _unlisted(imports: dict[str, set[str]], listed: dict[str, Requirement]) -> list[str]:
    """What the controller imports that neither ansible-core nor requirements.txt brings."""
    distributions = importlib.metadata.packages_distributions()
    brings = _ansible_core_brings()
    problems = []
    for module, files in sorted(_third_party(imports).items()):
        dists = {canonicalize_name(d) for d in distributions.get(module, [])}
        if not dists:
            problems.append(f"{module} (imported by {sorted(files)}) is not installed here: add "
                            "its distribution to requirements.txt and pyproject.toml")
        elif missing := dists - brings - set(listed):
            problems.append(f"{module} (imported by {sorted(files)} on the controller) comes "
                            f"from {sorted(missing)}: add it to the collection's requirements.txt")
    return problems


def test_requirements_list_what_the_controller_imports():
    """A controller-side plugin importing a package that is neither ansible-core's nor in
    requirements.txt fails here; so does a requirement nothing on the controller imports."""
    listed = _requirements()
    imports = controller_imports()
    assert _unlisted(imports, listed) == []
    distributions = importlib.metadata.packages_distributions()
    needed = {canonicalize_name(d) for m in _third_party(imports) for d in distributions[m]}
    assert set(listed) <= needed, f"listed, but no controller-side plugin imports it: {listed}"


def test_an_unlisted_import_fails_the_check(tmp_path):
    """The check above on a made-up lookup plugin: its lazy imports, and the collection's
    module_utils it imports, are the controller's; a module's imports are the nodes'."""
    plugins = tmp_path / "plugins"
    (plugins / "lookup").mkdir(parents=True)
    (plugins / "modules").mkdir()
    (plugins / "lookup" / "fetch.py").write_text(
        "from ansible_collections.torchherd.cluster.plugins.module_utils._codehash import x\n"
        "def run():\n    import requests\n    import no_such_package_here\n")
    (plugins / "modules" / "node.py").write_text("import boto3\n")  # runs on the nodes
    imports = controller_imports(plugins)
    assert set(_third_party(imports)) == {"no_such_package_here", "requests", "pathspec"}
    problems = _unlisted(imports, _requirements())
    assert len(problems) == 2, problems
    assert problems[0].startswith("no_such_package_here (imported by ['plugins/lookup/fetch.py']")
    assert problems[1].startswith("requests (imported by ['plugins/lookup/fetch.py']")
    without = _unlisted(imports, {})
    assert len(without) == 3 and "plugins/module_utils/_codehash.py" in without[1], without


def test_requirements_agree_with_the_wheels():
    """The wheel installs what the collection declares, with the same bounds."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wheel = {canonicalize_name(r.name): r for r in map(Requirement, project["dependencies"])}
    for name, req in _requirements().items():
        assert name in wheel, f"{name}: in requirements.txt, not in pyproject.toml's dependencies"
        assert req.specifier == wheel[name].specifier, (req, wheel[name])


# --- bindep.txt ---------------------------------------------------------------------------------

SSH_CLIENT = {"platform:dpkg": "openssh-client", "platform:rpm": "openssh-clients",
              "platform:apk": "openssh-client", "platform:arch": "openssh"}


@pytest.mark.parametrize("platform", sorted(SSH_CLIENT))
def test_bindep_names_rsync_and_the_ssh_client(platform):
    from bindep.depends import Depends

    rules = Depends((COLLECTION / "bindep.txt").read_text()).active_rules([platform])
    assert sorted(rule[0] for rule in rules) == sorted(["rsync", SSH_CLIENT[platform]])


def test_bindep_reads_the_file(tmp_path):
    """bindep's own command line reads it (and lists each package once per platform)."""
    done = _run([BIN / "bindep", "--file", COLLECTION / "bindep.txt", "--list_all=newline"],
                tmp_path, _env(tmp_path))
    assert "rsync" in done.stdout.split()


# --- meta/execution-environment.yml -------------------------------------------------------------

def _bare(lines: list[str]) -> list[str]:
    """Requirement lines without comments, as ansible-builder writes them."""
    return [line.split("#", 1)[0].strip() for line in lines if line.split("#", 1)[0].strip()]


def test_execution_environment_metadata_names_the_files():
    """ansible-builder reads a collection's meta/execution-environment.yml with paths relative to
    the collection's root; both files exist there."""
    meta = yaml.safe_load((COLLECTION / "meta" / "execution-environment.yml").read_text())
    assert meta["version"] == 3
    assert meta["dependencies"] == {"python": "requirements.txt", "system": "bindep.txt"}
    for name in meta["dependencies"].values():
        assert (COLLECTION / name).is_file()
    galaxy = yaml.safe_load((COLLECTION / "galaxy.yml").read_text())
    for name in ("requirements.txt", "bindep.txt", "meta"):
        assert name not in galaxy.get("build_ignore", [])


def test_ansible_builder_introspects_the_collection(tmp_path):
    """`ansible-builder introspect` on this checkout's collections finds both files' lines."""
    done = _run([BIN / "ansible-builder", "introspect", "--sanitize", REPO / "collection"],
                tmp_path, _env(tmp_path))
    found = yaml.safe_load(done.stdout)
    assert _bare(found["python"]) == _bare((COLLECTION / "requirements.txt").read_text()
                                           .splitlines())
    assert _bare(found["system"]) == _bare((COLLECTION / "bindep.txt").read_text().splitlines())


def _doc_execution_environment() -> str:
    text = (REPO / "docs" / "ansible.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", text, re.S)
    assert len(blocks) == 1, "docs/ansible.md: expected one yaml block, its execution environment"
    return blocks[0]


def test_the_docs_execution_environment_carries_the_requirements(tmp_path):
    """docs/ansible.md's execution environment, from a tarball that ansible-galaxy builds here:
    `ansible-builder create` writes a context that installs the collection and introspects it,
    and the introspection its Containerfile runs (run here on the installed tarball) yields
    requirements.txt and bindep.txt."""
    env = _env(tmp_path)
    work = tmp_path / "ee"
    work.mkdir()
    _run([BIN / "ansible-galaxy", "collection", "build", COLLECTION, "--output-path", work],
         tmp_path, env)
    (built,) = work.glob("torchherd-cluster-*.tar.gz")
    built.rename(work / "torchherd-cluster.tar.gz")
    (work / "execution-environment.yml").write_text(_doc_execution_environment())
    _run([BIN / "ansible-builder", "create", "-f", work / "execution-environment.yml",
          "-c", tmp_path / "context"], tmp_path, env)

    context = tmp_path / "context"
    containerfile = (context / "Containerfile").read_text()
    assert "ansible-galaxy collection install" in containerfile
    assert "introspect.py introspect" in containerfile
    assert "install-from-bindep" in containerfile and "ansible-core>=2.19,<2.20" in containerfile
    assert yaml.safe_load((context / "_build" / "requirements.yml").read_text()) == {
        "collections": [{"name": "collections/torchherd-cluster.tar.gz", "type": "file"}]}
    tarball = context / "_build" / "collections" / "torchherd-cluster.tar.gz"
    with tarfile.open(tarball) as tar:
        for name in ("requirements.txt", "bindep.txt", "meta/execution-environment.yml"):
            assert tar.extractfile(name).read() == (COLLECTION / name).read_bytes(), name

    # The image's builder stage: the collection installed, then introspected by the context's
    # own script.
    installed = tmp_path / "collections"
    _run([BIN / "ansible-galaxy", "collection", "install", tarball, "-p", installed],
         tmp_path, env)
    _run([sys.executable, context / "_build" / "scripts" / "introspect.py", "introspect",
          installed, f"--write-pip={tmp_path / 'pip.txt'}",
          f"--write-bindep={tmp_path / 'bindep.txt'}"], tmp_path, env)
    for ours, theirs in (("requirements.txt", "pip.txt"), ("bindep.txt", "bindep.txt")):
        assert _bare((tmp_path / theirs).read_text().splitlines()) == _bare(
            (COLLECTION / ours).read_text().splitlines()), ours


# --- the wheel ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel of this checkout's files (tracked, and new ones git does not ignore), built in a
    copy as tests/integration/helpers.py build_wheel builds it."""
    root = tmp_path_factory.mktemp("wheel")
    source = root / "source"
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=REPO, capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        if (REPO / name).is_symlink():
            os.symlink(os.readlink(REPO / name), source / name)
        elif (REPO / name).is_file():
            shutil.copy2(REPO / name, source / name)
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                            "--no-build-isolation", "-q", "-w", str(root / "dist"), str(source)],
                           cwd=root, capture_output=True, text=True, check=False, timeout=300)
    assert built.returncode == 0, built.stderr[-3000:]
    return next((root / "dist").glob("torchherd-*.whl"))


def _metadata(wheel: Path) -> email.message.Message:
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        return email.message_from_bytes(zf.read(name))


def test_twine_check_passes(wheel, tmp_path):
    done = _run([sys.executable, "-m", "twine", "check", "--strict", wheel], tmp_path,
                _env(tmp_path))
    assert "PASSED" in done.stdout


def test_the_wheels_metadata(wheel):
    import trove_classifiers

    meta = _metadata(wheel)
    assert meta["Version"] == (REPO / "VERSION").read_text().strip()
    classifiers = meta.get_all("Classifier")
    assert classifiers and not set(classifiers) - trove_classifiers.classifiers
    assert "Framework :: Ansible" in classifiers
    assert "ansible" in meta["Keywords"].split(",")
    assert meta["Description-Content-Type"] == "text/markdown"
    urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL"))
    assert {"Homepage", "Documentation", "Repository", "Issues", "Changelog"} <= set(urls), urls
    assert all(u.startswith("https://") for u in urls.values()), urls
    requires = {canonicalize_name(Requirement(r).name) for r in meta.get_all("Requires-Dist")
                if "extra ==" not in r}
    assert set(_requirements()) <= requires


def test_the_wheel_carries_the_collections_requirements(wheel):
    inside = "ansible_collections/torchherd/cluster/"
    with zipfile.ZipFile(wheel) as zf:
        for name in ("requirements.txt", "bindep.txt", "meta/execution-environment.yml"):
            assert zf.read(inside + name) == (COLLECTION / name).read_bytes(), name


def test_the_wheels_collection_is_what_ansible_galaxy_installs(wheel, tmp_path):
    """setup.py installs the collection's tarball into the wheel: MANIFEST.json and FILES.json
    of the driver's version name exactly the wheel's files of the collection, and
    `ansible-galaxy collection verify --offline` passes on the wheel's copy, unpacked as
    `pip install --no-compile` unpacks it (ansible-core's verify reports the __pycache__
    directories that byte-compiling adds to any collection: docs/ansible.md)."""
    inside = "ansible_collections/torchherd/cluster/"
    with zipfile.ZipFile(wheel) as zf:
        ours = sorted(n[len(inside):] for n in zf.namelist() if n.startswith(inside))
        manifest = json.loads(zf.read(inside + "MANIFEST.json"))
        listed = json.loads(zf.read(inside + "FILES.json"))["files"]
        zf.extractall(tmp_path / "site", [inside + name for name in ours])
    assert manifest["collection_info"]["version"] == (REPO / "VERSION").read_text().strip()
    assert sorted(f["name"] for f in listed if f["ftype"] == "file") == sorted(
        set(ours) - {"MANIFEST.json", "FILES.json"})
    for name in ("meta/runtime.yml", "playbooks/launch.yml", "requirements.txt", "CHANGELOG.md"):
        assert name in ours, name
    done = _run([BIN / "ansible-galaxy", "collection", "verify", "--offline", "-p",
                 tmp_path / "site", "torchherd.cluster"], tmp_path, _env(tmp_path))
    assert f"found at '{tmp_path / 'site' / inside.rstrip('/')}'" in done.stdout, done.stdout
    assert "internally consistent with its manifest" in done.stdout, done.stdout


def test_the_long_descriptions_links_are_absolute_and_name_repository_files(wheel):
    """On a package index a relative link resolves against no repository: the long description
    is the README with each relative link made absolute, naming the file in the repository the
    Repository link leads to. Each such file must exist, and nothing else of the README changes."""
    meta = _metadata(wheel)
    description = meta.get_payload()
    repository = dict(u.split(", ", 1) for u in meta.get_all("Project-URL"))["Repository"]
    readme = (REPO / "README.md").read_text()
    link = r"\]\(([^)\s#]+)(?:#[^)]*)?\)"
    relative = [t for t in re.findall(link, readme) if not re.match(r"[a-z][a-z0-9+.-]*:", t)]
    assert relative, "expected the README's links to docs/"
    targets = re.findall(link, description)
    assert not [t for t in targets if not re.match(r"[a-z][a-z0-9+.-]*:", t)], targets
    prefix = f"{repository}/blob/main/"
    ours = [t.removeprefix(prefix) for t in targets if t.startswith(prefix)]
    assert ours == relative, (ours, relative)
    assert not [t for t in ours if not (REPO / t).exists()]
    assert prefix not in readme
    assert description.replace(prefix, "").strip() == readme.strip()


# --- scripts/set-version.py ---------------------------------------------------------------------

def test_set_version_writes_the_one_version_everywhere(tmp_path):
    """On a copy: a new version goes into VERSION, galaxy.yml and the plan's vars, and nothing
    else in them changes; --check names a copy that differs."""
    collection = Path("collection/ansible_collections/torchherd/cluster")
    files = [Path("VERSION"), collection / "galaxy.yml", collection / "roles/plan/vars/main.yml"]
    for name in files:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, tmp_path / name)
    script = [sys.executable, REPO / "scripts" / "set-version.py", "--root", tmp_path]
    env = _env(tmp_path)
    _run([*script, "--check"], tmp_path, env)
    old = (REPO / "VERSION").read_text().strip()

    _run([*script, "9.8.7rc1"], tmp_path, env)
    assert (tmp_path / "VERSION").read_text() == "9.8.7rc1\n"
    for name in files[1:]:
        before, after = (REPO / name).read_text(), (tmp_path / name).read_text()
        assert after == re.sub(rf"(?m)^(\w+: ){re.escape(old)}$", r"\g<1>9.8.7rc1", before)
        assert after != before
    assert yaml.safe_load((tmp_path / files[1]).read_text())["version"] == "9.8.7rc1"
    _run([*script, "--check"], tmp_path, env)

    (tmp_path / "VERSION").write_text("9.8.8\n")
    checked = subprocess.run([str(a) for a in (*script, "--check")], capture_output=True,
                             text=True, check=False)
    assert checked.returncode == 1
    assert "galaxy.yml: 9.8.7rc1, VERSION: 9.8.8" in checked.stderr
    _run([*script, "VERSION"], tmp_path, env)
    _run([*script, "--check"], tmp_path, env)


def test_the_checkouts_playbooks_find_the_collection_from_any_directory(tmp_path):
    """ansible-playbook <checkout>/playbooks/verify.yml from elsewhere, with no configuration of
    the checkout's or the user's: the collection is beside the playbooks (playbooks/collections,
    a link to collection/), where Ansible looks first for a playbook's collections."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**_env(tmp_path), "ANSIBLE_COLLECTIONS_PATH": str(tmp_path / "no-collections")}
    done = _run([BIN / "ansible-playbook", "--syntax-check", "-i", "localhost,",
                 REPO / "playbooks" / "verify.yml"], elsewhere, env)
    assert "playbook: " in done.stdout
    link = REPO / "playbooks" / "collections"
    assert link.is_symlink() and link.resolve() == (REPO / "collection").resolve()


def test_every_playbook_passes_ansible_playbooks_syntax_check(tmp_path):
    """--syntax-check templates each play's hosts with no hostvars and no facts: a play that takes
    its hosts from the run's schedule (launch.yml's Watch and Teardown) must still pass it."""
    env = _env(tmp_path)
    books = sorted(p for p in (REPO / "playbooks").glob("*.yml") if p.is_file())
    assert {"launch.yml", "verify.yml", "stop.yml"} <= {p.name for p in books}
    done = _run([BIN / "ansible-playbook", "--syntax-check", "-i", "localhost,", *books],
                tmp_path, env)
    assert done.stdout.count("playbook: ") == len(books), done.stdout
