// Removes a build output directory (dist or build) before it is written again, so a file
// whose source is gone is not left behind (and not run as a test).
import { rmSync } from "node:fs";
import { fileURLToPath } from "node:url";

for (const dir of process.argv.slice(2)) {
  if (dir !== "dist" && dir !== "build") throw new Error(`clean: not a build directory: ${dir}`);
  rmSync(fileURLToPath(new URL(`../${dir}`, import.meta.url)), { recursive: true, force: true });
}
