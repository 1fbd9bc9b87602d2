// After the two tsc builds: dist/cjs is CommonJS (its own package.json), and the Lua
// fallback is copied into dist/redis_rl.lua (exported as "redis-rl/redis_rl.lua", for
// operators who load it themselves), from the repository's one copy.
import { copyFileSync, writeFileSync } from "node:fs";
import { fileURLToPath } from "node:url";

const here = (p) => fileURLToPath(new URL(p, import.meta.url));
writeFileSync(here("../dist/cjs/package.json"), JSON.stringify({ type: "commonjs" }) + "\n");
writeFileSync(here("../dist/esm/package.json"), JSON.stringify({ type: "module" }) + "\n");
copyFileSync(here("../../../scripts/lua/redis_rl.lua"), here("../dist/redis_rl.lua"));
