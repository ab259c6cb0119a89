#!/usr/bin/env node
// `prepare`: builds dist/ with tsc. When the package is installed from its folder
// (`npm install path/to/sdk/typescript`), npm runs this in the folder without installing
// the folder's dev dependencies first; then they are installed here from the lock file
// (`npm ci --ignore-scripts`, the pinned TypeScript) before building.
import { execFileSync } from "node:child_process";
import { existsSync } from "node:fs";
import { fileURLToPath } from "node:url";

const root = fileURLToPath(new URL("..", import.meta.url));
const tsc = fileURLToPath(new URL("../node_modules/typescript/bin/tsc", import.meta.url));

if (!existsSync(tsc)) {
  const npmCli = process.env.npm_execpath;
  const [cmd, args] =
    npmCli && npmCli.endsWith(".js") ? [process.execPath, [npmCli]] : [process.platform === "win32" ? "npm.cmd" : "npm", []];
  // The installing npm's own settings (a global prefix, --omit=dev) must not apply here.
  const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.toLowerCase().startsWith("npm_config_")));
  execFileSync(cmd, [...args, "ci", "--ignore-scripts", "--no-audit", "--no-fund", "--include=dev"], {
    cwd: root,
    env,
    stdio: ["ignore", "inherit", "inherit"],
  });
}
execFileSync(process.execPath, [tsc, "-p", "tsconfig.json"], { cwd: root, stdio: "inherit" });
