"""Build hook: puts the repository's one copy of the Lua fallback into the package.

The Functions library lives at `scripts/lua/redis_rl.lua` in the repository, two levels above
this directory; the wheel carries it as `redis_rl/lua/redis_rl.lua`. An sdist carries it at
`lua/redis_rl.lua`, so a wheel built from the sdist finds it there. No copy is kept in the
tree.
"""

from __future__ import annotations

import os
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface


class LuaLibraryHook(BuildHookInterface):  # type: ignore[type-arg]
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        candidates = [
            os.path.join(self.root, "..", "..", "scripts", "lua", "redis_rl.lua"),
            os.path.join(self.root, "lua", "redis_rl.lua"),  # inside an sdist
        ]
        source = next((p for p in candidates if os.path.isfile(p)), None)
        if source is None:
            if os.environ.get("REDIS_RL_REQUIRE_LUA"):
                raise RuntimeError("scripts/lua/redis_rl.lua not found: the fallback cannot be packaged")
            self.app.display_warning(
                "redis-rl: scripts/lua/redis_rl.lua not found; building without the Lua fallback "
                "(mode='fallback' will not be available)"
            )
            return
        target = "redis_rl/lua/redis_rl.lua" if self.target_name == "wheel" else "lua/redis_rl.lua"
        build_data["force_include"][os.path.abspath(source)] = target
