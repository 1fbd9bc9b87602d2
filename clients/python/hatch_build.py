"""Build hook: puts the repository's one copy of the Lua fallback into the package.

The Functions library lives at `scripts/lua/redis_rl.lua` in the repository, two levels above
this directory; the wheel carries it as `redis_rl/lua/redis_rl.lua`. An sdist carries it at
`lua/redis_rl.lua`, so a wheel built from the sdist finds it there. No copy is kept in the
tree, and a build that finds neither fails: a package without its fallback is not built.
"""

from __future__ import annotations

import os
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface


class LuaLibraryHook(BuildHookInterface):  # type: ignore[type-arg]
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        candidates = [
            os.path.join(self.root, "..", "..", "scripts", "lua", "redis_rl.lua"),  # checkout
            os.path.join(self.root, "lua", "redis_rl.lua"),  # inside an sdist
        ]
        source = next((p for p in candidates if os.path.isfile(p)), None)
        if source is None:
            raise RuntimeError(
                "redis-rl: the Lua fallback was not found (scripts/lua/redis_rl.lua in a checkout "
                "of the repository, or lua/redis_rl.lua in an sdist); build the package from the "
                "repository or from its sdist"
            )
        target = "redis_rl/lua/redis_rl.lua" if self.target_name == "wheel" else "lua/redis_rl.lua"
        build_data["force_include"][os.path.abspath(source)] = target
