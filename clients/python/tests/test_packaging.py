"""The package as built and shipped: typed (mypy --strict clean), the wheel holds py.typed and
the Lua fallback from the repository's one copy, and no second copy lives in the tree."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1]
ROOT = PKG.parents[1]
LUA = ROOT / "scripts" / "lua" / "redis_rl.lua"


def test_mypy_strict_is_clean() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--config-file", str(PKG / "pyproject.toml"),
         str(PKG / "src" / "redis_rl")],
        capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "--disable-pip-version-check", "-w", str(out), str(PKG)],
        check=True, timeout=300,
    )
    (whl,) = out.glob("redis_rl-*.whl")
    return whl


def test_wheel_is_typed_and_complete(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for module in ("__init__", "client", "aio", "http", "asgi", "wsgi", "starlette", "flask", "django"):
        assert f"redis_rl/{module}.py" in names
    assert "redis_rl/py.typed" in names
    meta = next(n for n in names if n.endswith("METADATA"))
    text = zipfile.ZipFile(wheel).read(meta).decode()
    assert "Requires-Dist: redis>=5" in text
    assert "Provides-Extra: fastapi" in text and "Provides-Extra: flask" in text


def test_wheel_carries_the_lua_fallback_from_the_one_copy(wheel: Path) -> None:
    z = zipfile.ZipFile(wheel)
    assert z.read("redis_rl/lua/redis_rl.lua") == LUA.read_bytes()


def test_the_installed_package_uses_its_packaged_library() -> None:
    # The suite runs against the package as installed (not editable): the fallback it loads
    # is the copy inside the package, identical to the repository's.
    import redis_rl
    from redis_rl._protocol import library_path

    path = library_path()
    assert path is not None
    assert path == Path(redis_rl.__file__).parent / "lua" / "redis_rl.lua"
    assert path.read_bytes() == LUA.read_bytes()


def test_a_build_without_the_lua_file_fails(tmp_path: Path) -> None:
    # The package copied out of the repository has no scripts/lua/redis_rl.lua above it.
    src = tmp_path / "python"
    shutil.copytree(PKG, src, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build", "dist"))
    out = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "--disable-pip-version-check", "-w", str(tmp_path / "dist"), str(src)],
        capture_output=True, text=True, timeout=300,
    )
    assert out.returncode != 0
    assert "the Lua fallback was not found" in out.stdout + out.stderr
    assert not list((tmp_path / "dist").glob("*.whl"))


def test_a_wheel_built_from_the_sdist_carries_the_library(tmp_path: Path) -> None:
    from hatchling.builders.sdist import SdistBuilder

    (sdist,) = [Path(p) for p in SdistBuilder(str(PKG)).build(directory=str(tmp_path / "sdist"))]
    with tarfile.open(sdist) as t:
        t.extractall(tmp_path / "unpacked", filter="data")
    (root,) = list((tmp_path / "unpacked").iterdir())
    assert (root / "lua" / "redis_rl.lua").read_bytes() == LUA.read_bytes()
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "--disable-pip-version-check", "-w", str(tmp_path / "dist"), str(root)],
        check=True, timeout=300,
    )
    (whl,) = (tmp_path / "dist").glob("redis_rl-*.whl")
    assert zipfile.ZipFile(whl).read("redis_rl/lua/redis_rl.lua") == LUA.read_bytes()


def test_no_second_copy_of_the_fallback_in_the_tree() -> None:
    files = subprocess.run(["git", "ls-files", str(PKG)], cwd=ROOT, capture_output=True, text=True).stdout
    assert not [f for f in files.splitlines() if f.endswith(".lua")]
