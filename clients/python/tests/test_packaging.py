"""The package as built and shipped: typed (mypy --strict clean), the wheel holds py.typed and
the Lua fallback from the repository's one copy, and no second copy lives in the tree."""

from __future__ import annotations

import subprocess
import sys
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
    if not LUA.exists():
        pytest.skip("scripts/lua/redis_rl.lua is not in this tree yet: nothing to package")
    z = zipfile.ZipFile(wheel)
    assert z.read("redis_rl/lua/redis_rl.lua") == LUA.read_bytes()


def test_no_second_copy_of_the_fallback_in_the_tree() -> None:
    files = subprocess.run(["git", "ls-files", str(PKG)], cwd=ROOT, capture_output=True, text=True).stdout
    assert not [f for f in files.splitlines() if f.endswith(".lua")]
