// After the two tsc builds: dist/cjs is CommonJS (its own package.json), and the Lua
// fallback is copied into dist/redis_rl.lua (exported as "redis-rl/redis_rl.lua", for
// operators who load it themselves), from the repository's one copy.
import { copyFileSync, readFileSync, writeFileSync } from "node:fs";
import { fileURLToPath } from "node:url";

const here = (p) => fileURLToPath(new URL(p, import.meta.url));
writeFileSync(here("../dist/cjs/package.json"), JSON.stringify({ type: "commonjs" }) + "\n");
writeFileSync(here("../dist/esm/package.json"), JSON.stringify({ type: "module" }) + "\n");
copyFileSync(here("../../../scripts/lua/redis_rl.lua"), here("../dist/redis_rl.lua"));
// req.rateLimit's type (src/http/express-request.d.ts, a global augmentation that tsc does not
// copy): one file, referenced from both builds' express.d.ts.
copyFileSync(here("../src/http/express-request.d.ts"), here("../dist/esm/http/express-request.d.ts"));
for (const [dts, ref] of [
  ["../dist/esm/http/express.d.ts", "./express-request.d.ts"],
  ["../dist/cjs/http/express.d.ts", "../../esm/http/express-request.d.ts"],
]) {
  writeFileSync(here(dts), `/// <reference path="${ref}" />\n` + readFileSync(here(dts), "utf8"));
}
