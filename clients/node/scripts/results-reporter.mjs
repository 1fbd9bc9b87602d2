// A node --test reporter that writes the outcomes in scripts/test.sh's results format, one
// a line: "fail clients/node::<file>::<test path>" for each failed test (suites are not
// counted, their tests are), then "pass N"; or "notrun clients/node: ..." when the run
// ended before node's summary (a crash, a timeout).
import { relative } from "node:path";

const PREFIX = "clients/node::";

export default async function* results(source) {
  const stack = [];
  let passed = 0;
  let summary = false;
  for await (const event of source) {
    const data = event.data ?? {};
    if (event.type === "test:start") {
      stack[data.nesting] = data.name;
      stack.length = data.nesting + 1;
    } else if (event.type === "test:pass" || event.type === "test:fail") {
      if (data.details?.type === "suite") continue;
      if (data.skip || data.todo) continue;
      if (event.type === "test:pass") passed++;
      else {
        const path = [...stack.slice(0, data.nesting), data.name].filter(Boolean).join(" > ");
        // build/test/x.test.js is test/x.test.ts, where it is written.
        const file = data.file
          ? relative(process.cwd(), data.file)
              .replace(/^build\//, "")
              .replace(/\.js$/, ".ts")
          : "";
        yield `fail ${PREFIX}${file ? file + "::" : ""}${path}\n`;
      }
    } else if (event.type === "test:diagnostic" && /^tests \d+$/.test(data.message ?? "")) {
      summary = true;
    }
  }
  if (passed > 0) yield `pass ${passed}\n`;
  if (!summary) yield "notrun clients/node: node --test stopped before its summary\n";
}
