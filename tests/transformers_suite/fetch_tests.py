"""Obtain transformers' own test tree (tests/generation, tests/models, the root conftest.py) for the
installed transformers version, and cache it under `$ASSISTED_BACKENDS_CACHE` (default
`~/.cache/assisted_backends`) as `transformers-tests/<version>/`.

Sources, tried in this order (the first that works wins; every failure is reported):

1. the cache (a previous fetch: `PROVENANCE.json` says where it came from);
2. the PyPI sdist `transformers-<version>.tar.gz` (`pip download --no-binary :all: --no-deps`), used when it
   holds `tests/generation/test_utils.py`. transformers 5.x sdists do not: setuptools' default sdist rules
   add only the top-level `tests/test*.py` files (test_modeling_common.py, ...), not `tests/generation/`
   nor `tests/models/` (checked on 5.23.0 and 5.24.0);
3. a git clone of tag `v<version>` from the upstream repository (sparse: tests/ and conftest.py), where that
   host is reachable (not from this project's machines, which reach package registries only);
4. `TRANSFORMERS_TESTS_SRC`: a transformers checkout, a bare/mirror git directory (with
   `TRANSFORMERS_TESTS_REF`, a commit or tag; default HEAD) or a `.tar.gz` of the repository.

No other registry has the tree: Debian ships no transformers package, and npm's packages named after it
are the JavaScript port. The tree found is recorded in PROVENANCE.json with the transformers version its
`src/transformers/__init__.py` declares, so a mismatch with the installed version is visible.

    python tests/transformers_suite/fetch_tests.py            # prints the cached tree's path
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

UPSTREAM = "https://github.com/huggingface/transformers"
NEEDED = "tests/generation/test_utils.py"
KEEP = ("tests/", "utils/", "conftest.py", "pyproject.toml", "src/transformers/__init__.py")
PATHS = ("tests", "utils", "conftest.py", "pyproject.toml", "src/transformers/__init__.py")


def cache_root() -> Path:
    from assisted_backends.cache_dir import cache_root as package_cache

    return package_cache()


def installed_version() -> str:
    import transformers

    return transformers.__version__


def _declared_version(tree: Path) -> str | None:
    init = tree / "src" / "transformers" / "__init__.py"
    if not init.exists():
        return None
    found = re.search(r'^__version__ = "([^"]+)"', init.read_text(encoding="utf-8"), re.M)
    return found.group(1) if found else None


def _finish(staging: Path, dest: Path, provenance: dict) -> Path:
    if not (staging / NEEDED).exists():
        raise RuntimeError(f"the tree has no {NEEDED}")
    provenance["tests_declared_version"] = _declared_version(staging)
    shutil.rmtree(staging / "src", ignore_errors=True)  # `link_installed` points src/transformers at the installed one
    provenance["installed_transformers"] = installed_version()
    (staging / "PROVENANCE.json").write_text(json.dumps(provenance, indent=2) + "\n", encoding="utf-8")
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.exists():
        shutil.rmtree(dest)
    shutil.move(str(staging), str(dest))
    return dest


def _from_tarball(archive: Path, staging: Path) -> None:
    with tarfile.open(archive) as tar:
        members = tar.getmembers()
        top = members[0].name.split("/")[0]
        for member in members:
            relative = member.name[len(top) + 1 :]
            if member.isfile() and relative.startswith(KEEP):
                member.name = relative
                tar.extract(member, staging, filter="data")


def from_sdist(version: str, staging: Path) -> dict:
    with tempfile.TemporaryDirectory() as download:
        command = [sys.executable, "-m", "pip", "download", "-q", "--no-binary", ":all:", "--no-deps"]
        subprocess.run([*command, f"transformers=={version}", "-d", download], check=True, timeout=600)
        (archive,) = Path(download).glob("transformers-*.tar.gz")
        with tarfile.open(archive) as tar:
            names = [name.split("/", 1)[1] for name in tar.getnames() if "/" in name]
        if NEEDED not in names:
            tests = sorted(name for name in names if name.startswith("tests/") and name.endswith(".py"))
            nested = [name for name in tests if name.count("/") > 1]
            raise RuntimeError(
                f"the PyPI sdist {archive.name} holds {len(tests)} files under tests/, {len(nested)} of them in "
                f"sub-directories: no {NEEDED} and no tests/models/ (setuptools' default sdist includes only "
                "tests/test*.py)"
            )
        _from_tarball(archive, staging)
    return {"source": "pypi-sdist", "ref": f"transformers=={version}"}


def from_git_clone(version: str, staging: Path) -> dict:
    tag = f"v{version}"
    clone = ["git", "clone", "-q", "--depth", "1", "--filter=blob:none", "--sparse", "--branch", tag, UPSTREAM]
    with tempfile.TemporaryDirectory() as work:
        checkout = Path(work) / "transformers"
        environment = {**os.environ, "GIT_TERMINAL_PROMPT": "0"}
        subprocess.run([*clone, str(checkout)], check=True, timeout=120, env=environment, capture_output=True)
        subprocess.run(
            ["git", "-C", str(checkout), "sparse-checkout", "set", "tests", "utils", "src/transformers"], check=True
        )
        _copy_checkout(checkout, staging)
    return {"source": "git-clone", "ref": f"{UPSTREAM}@{tag}"}


def _copy_checkout(checkout: Path, staging: Path) -> None:
    shutil.copytree(checkout / "tests", staging / "tests")
    shutil.copytree(checkout / "utils", staging / "utils")
    for name in ("conftest.py", "pyproject.toml"):
        if (checkout / name).exists():
            shutil.copy2(checkout / name, staging / name)
    (staging / "src" / "transformers").mkdir(parents=True)
    shutil.copy2(checkout / "src" / "transformers" / "__init__.py", staging / "src" / "transformers" / "__init__.py")


def from_local(source: str, staging: Path) -> dict:
    path = Path(source)
    ref = os.environ.get("TRANSFORMERS_TESTS_REF", "HEAD")
    if path.is_file():
        _from_tarball(path, staging)
        return {"source": "tarball", "ref": str(path)}
    if (path / "tests").is_dir():
        _copy_checkout(path, staging)
        return {"source": "checkout", "ref": str(path)}
    # a git directory (bare or mirror): export the ref's files we need
    commit = subprocess.run(
        ["git", "--git-dir", str(path), "rev-parse", f"{ref}^{{commit}}"], check=True, capture_output=True, text=True
    ).stdout.strip()
    archive = subprocess.run(
        ["git", "--git-dir", str(path), "archive", "--format=tar", commit, *PATHS], check=True, capture_output=True
    ).stdout
    staging.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(suffix=".tar") as handle:
        handle.write(archive)
        handle.flush()
        with tarfile.open(handle.name) as tar:
            tar.extractall(staging, filter="data")
    return {"source": "git-directory", "ref": f"{path}@{commit}"}


def _checked(tree: Path, version: str) -> Path:
    """`tree`, when its tests are those of `version` (else the mismatch is an error: tests of another release
    test another API; HF_LANE_ALLOW_MISMATCH=1 runs them anyway)."""
    declared = json.loads((tree / "PROVENANCE.json").read_text(encoding="utf-8")).get("tests_declared_version")
    if declared != version and os.environ.get("HF_LANE_ALLOW_MISMATCH") != "1":
        raise SystemExit(
            f"{tree} holds the tests of transformers {declared}, not {version}: seed it with the v{version} tree "
            "(fetch_tests.py --refresh with TRANSFORMERS_TESTS_SRC / TRANSFORMERS_TESTS_REF), run the lane with "
            f"HF_LANE_TRANSFORMERS={declared}, or set HF_LANE_ALLOW_MISMATCH=1"
        )
    return tree


def link_installed(tree: Path) -> None:
    """Point the tree's `src/transformers` at the installed transformers: tests that read the sources
    (`direct_transformers_import(<repo>/src/transformers)`, pipelines) then see the code under test."""
    import transformers

    link = tree / "src" / "transformers"
    link.parent.mkdir(exist_ok=True)
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(Path(transformers.__file__).parent, target_is_directory=True)


def fetch(version: str | None = None, refresh: bool = False) -> Path:
    """The cached test tree for `version` (default: the installed one); fetched when missing."""
    version = version or installed_version()
    dest = cache_root() / "transformers-tests" / version
    if (dest / "PROVENANCE.json").exists() and not refresh:
        return _checked(dest, version)
    attempts = [("PyPI sdist", lambda s: from_sdist(version, s)), ("git clone", lambda s: from_git_clone(version, s))]
    if os.environ.get("TRANSFORMERS_TESTS_SRC"):
        attempts.insert(0, ("TRANSFORMERS_TESTS_SRC", lambda s: from_local(os.environ["TRANSFORMERS_TESTS_SRC"], s)))
    failures = []
    for name, attempt in attempts:
        staging = Path(tempfile.mkdtemp(prefix="hf-tests-"))
        try:
            provenance = attempt(staging)
            return _checked(_finish(staging, dest, provenance), version)
        except (RuntimeError, OSError, ValueError, subprocess.SubprocessError) as error:
            detail = getattr(error, "stderr", None)
            detail = detail.decode(errors="replace").strip()[-300:] if isinstance(detail, bytes) else ""
            failures.append(f"- {name}: {error} {detail}".rstrip())
            shutil.rmtree(staging, ignore_errors=True)
    raise SystemExit(
        f"cannot obtain transformers' test tree for transformers {version}:\n" + "\n".join(failures) + "\n"
        "Point TRANSFORMERS_TESTS_SRC at a transformers checkout, git directory (+ TRANSFORMERS_TESTS_REF) or "
        f"repository tarball to seed {dest}"
    )


if __name__ == "__main__":
    tree = fetch(refresh="--refresh" in sys.argv)
    link_installed(tree)
    print(tree)
