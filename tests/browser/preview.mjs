// Opens a preview link in headless Chromium, the way a person clicks it, for the browser
// test (tests/it/browser.rs). Driven over stdin and stdout, one JSON line per step:
//
//   node preview.mjs URL
//   -> {"step":"opened", "status", "url", "greeting", "echo", "cookies"}   (the page rendered,
//      its WebSocket answered, the cookies the browser now holds for the page's host)
//   <- any line (the test revoked the link meanwhile)
//   -> {"step":"reloaded", "status", "body"}                                  (the same tab again)
//
// Needs SANDLANE_TEST_CHROMIUM (the browser) and SANDLANE_TEST_PLAYWRIGHT (a directory whose
// node_modules holds playwright-core): `scripts/browser.sh start` prints both.
import { createRequire } from "node:module";
import path from "node:path";
import readline from "node:readline";

const url = process.argv[2];
if (!url) {
  console.error("usage: node preview.mjs URL");
  process.exit(2);
}
const require = createRequire(path.join(process.env.SANDLANE_TEST_PLAYWRIGHT ?? ".", "index.js"));
const { chromium } = require("playwright-core");

const say = (message) => process.stdout.write(JSON.stringify(message) + "\n");
const lines = readline.createInterface({ input: process.stdin })[Symbol.asyncIterator]();

const browser = await chromium.launch({
  executablePath: process.env.SANDLANE_TEST_CHROMIUM,
  headless: true,
  // Chromium's own sandbox refuses to run as root; the test machine runs as root.
  args: process.getuid?.() === 0 ? ["--no-sandbox"] : [],
  timeout: 60_000,
});
try {
  const context = await browser.newContext();
  const page = await context.newPage();
  const response = await page.goto(url, { waitUntil: "load", timeout: 30_000 });
  const echo = page.locator("#echo");
  await page.waitForFunction(() => document.getElementById("echo")?.textContent !== "waiting for the WebSocket", null, {
    timeout: 15_000,
  });
  say({
    step: "opened",
    status: response?.status() ?? 0,
    url: page.url(),
    greeting: await page.locator("#greeting").textContent(),
    echo: await echo.textContent(),
    cookies: await context.cookies(),
  });
  await lines.next();
  const again = await page.reload({ waitUntil: "load", timeout: 30_000 });
  say({ step: "reloaded", status: again?.status() ?? 0, body: await page.locator("body").innerText() });
} finally {
  await browser.close();
}
