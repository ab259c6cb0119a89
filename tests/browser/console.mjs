// Drives the console (/console) in headless Chromium the way a person does, for the console
// test (tests/it/console.rs): a wrong key, then the right one; the sandbox list, one
// sandbox's processes, files, terminal, preview links and snapshots; the audit tail and its
// verdict; the policy; signing out. Each step is checked here and reported; a screenshot of
// each is written into CONSOLE_SHOTS. Prints one JSON line: {"steps": {...}, "shots": [...]}.
//
//   CONSOLE_URL=http://127.0.0.1:PORT CONSOLE_ORG=acme CONSOLE_KEY=… CONSOLE_SANDBOX=sbx_…
//   CONSOLE_SHOTS=DIR node console.mjs
//
// Needs SANDLANE_TEST_CHROMIUM and SANDLANE_TEST_PLAYWRIGHT (`scripts/browser.sh start`).
import { createRequire } from "node:module";
import path from "node:path";

const env = (name) => {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set`);
  return value;
};
const base = env("CONSOLE_URL");
const org = env("CONSOLE_ORG");
const key = env("CONSOLE_KEY");
const sandbox = env("CONSOLE_SANDBOX");
const shotsDir = env("CONSOLE_SHOTS");
const require = createRequire(path.join(process.env.SANDLANE_TEST_PLAYWRIGHT ?? ".", "index.js"));
const { chromium } = require("playwright-core");

const steps = {};
const shots = [];
const problems = [];
const check = (ok, what) => {
  if (!ok) throw new Error(what);
};

const openapi = await (await fetch(`${base}/openapi.json`)).json();
const hasTerminals = Object.keys(openapi.paths).some((p) => p.includes("/terminals"));
const hasPreviews = Object.keys(openapi.paths).some((p) => p.includes("/ports/{port}/links"));

const browser = await chromium.launch({
  executablePath: process.env.SANDLANE_TEST_CHROMIUM,
  headless: true,
  args: process.getuid?.() === 0 ? ["--no-sandbox"] : [],
  timeout: 60_000,
});
try {
  const context = await browser.newContext({ viewport: { width: 1280, height: 720 } });
  const page = await context.newPage();
  page.setDefaultTimeout(20_000);
  page.on("pageerror", (e) => problems.push(`page error: ${e.message}`));
  page.on("console", (m) => {
    // A refused request is the console's own business (it shows it); anything else is not.
    if (m.type() === "error" && !/Failed to load resource/.test(m.text())) problems.push(`console: ${m.text()}`);
  });

  const shot = async (name) => {
    const file = path.join(shotsDir, `${String(shots.length + 1).padStart(2, "0")}-${name}.png`);
    await page.screenshot({ path: file, fullPage: false });
    shots.push(file);
  };
  // No horizontal scrollbar at 1280×720.
  const fits = async (view) => {
    const { scroll, client } = await page.evaluate(() => ({
      scroll: document.documentElement.scrollWidth,
      client: document.documentElement.clientWidth,
    }));
    check(scroll <= client, `${view}: the page is ${scroll} px wide in a ${client} px window (a horizontal scrollbar)`);
    return { scroll, client };
  };
  const storage = () =>
    page.evaluate(() => ({
      session: sessionStorage.getItem("sandlane.console.key"),
      local: Object.keys(localStorage).map((k) => localStorage.getItem(k)),
      cookie: document.cookie,
    }));

  // 1. The page, with its headers.
  const response = await page.goto(`${base}/console`, { waitUntil: "load" });
  const headers = response.headers();
  steps.page = {
    status: response.status(),
    csp: headers["content-security-policy"],
    frame: headers["x-frame-options"],
  };
  await page.getByLabel("Org").waitFor();

  // 2. A wrong key: a clear error, nothing kept.
  await page.getByLabel("Org").fill(org);
  await page.getByLabel("Service key").fill("sk_wrong");
  await page.getByRole("button", { name: "Sign in" }).click();
  const error = page.getByRole("alert");
  await error.waitFor({ state: "visible" });
  steps.wrong_key = { error: await error.textContent(), stored: await storage() };
  await shot("wrong-key");

  // 3. The right key, submitted from the keyboard.
  await page.getByLabel("Service key").fill(key);
  await page.getByLabel("Service key").press("Enter");
  const row = page.locator("#sandboxes-table tbody tr", { hasText: sandbox });
  await row.waitFor();
  const stored = await storage();
  steps.signed_in = {
    row: await row.innerText(),
    error_hidden: await error.isHidden(),
    session_has_key: stored.session === key,
    local_has_key: stored.local.some((v) => v?.includes(key)),
    document_cookie: stored.cookie,
    cookies: (await context.cookies()).length,
    fits: await fits("sandboxes"),
  };
  await shot("sandboxes");

  // Keyboard: Tab from the top reaches the skip link first, then the views' links; Enter
  // on one follows it; a focused control shows its focus ring.
  await page.reload({ waitUntil: "load" });
  await row.waitFor();
  const order = [];
  for (let i = 0; i < 6; i++) {
    await page.keyboard.press("Tab");
    order.push(
      await page.evaluate(() => {
        const el = document.activeElement;
        const outline = getComputedStyle(el).outlineStyle;
        const text = el.labels?.[0]?.textContent || el.getAttribute("aria-label") || el.textContent || "";
        return { tag: el.tagName.toLowerCase(), text: text.trim(), outline };
      }),
    );
  }
  steps.tab_order = order;
  check(order[0].text === "Skip to the content", `the first Tab stop is the skip link: ${JSON.stringify(order)}`);
  const sandboxesLink = order.findIndex((o) => o.text === "Sandboxes");
  check(sandboxesLink > 0, `Tab reaches the Sandboxes link: ${JSON.stringify(order)}`);
  check(order.every((o) => o.outline !== "none"), `every focused control shows a focus ring: ${JSON.stringify(order)}`);

  // 4. One sandbox: its processes.
  await row.getByRole("link", { name: sandbox }).focus();
  await page.keyboard.press("Enter");
  await page.getByRole("heading", { name: `Sandbox ${sandbox}` }).waitFor();
  await page.getByLabel(/Start a background process/).fill("echo console-was-here; sleep 30");
  await page.getByRole("button", { name: "Start", exact: true }).click();
  const processRow = page.locator("#processes-table tbody tr", { hasText: "console-was-here" });
  await processRow.waitFor();
  await processRow.getByRole("button", { name: /Output of process/ }).click();
  await page.locator("#process-output", { hasText: "console-was-here" }).waitFor();
  steps.processes = { row: await processRow.innerText(), fits: await fits("processes") };
  await shot("processes");

  // 5. Its files: the workspace, then a file in it.
  await page.getByRole("link", { name: "Files" }).click();
  const fileButton = page.getByRole("button", { name: "Open file hello.txt" });
  await fileButton.waitFor();
  await fileButton.press("Enter");
  await page.locator("#file-content", { hasText: "hello from the API" }).waitFor();
  steps.files = {
    entries: await page.locator("#files-table tbody").innerText(),
    content: await page.locator("#file-content").textContent(),
    fits: await fits("files"),
  };
  await shot("files");

  // 6. Its terminal (only where the server has the terminal route).
  await page.getByRole("link", { name: "Terminal" }).click();
  await page.getByRole("button", { name: "Open a terminal" }).click();
  if (hasTerminals) {
    await page.locator("#terminal .xterm").waitFor();
    await page.locator("#terminal-note", { hasText: "Connected" }).waitFor();
    await page.keyboard.type("echo $((6*7))\r");
    await page.waitForFunction(() => /^42\s*$/m.test(document.querySelector("#terminal .xterm-rows")?.innerText ?? ""), null, {
      timeout: 15_000,
    });
    const screen = await page.locator("#terminal .xterm-rows").innerText();
    await shot("terminal");
    // Close ends the shell: the sandbox keeps no running terminal.
    await page.getByRole("button", { name: "Close" }).click();
    await page.locator("#terminal-note", { hasText: "Closed." }).waitFor();
    let running = -1;
    for (let i = 0; i < 50 && running !== 0; i++) {
      const listed = await fetch(`${base}/v1/orgs/${org}/sandboxes/${sandbox}/terminals`, {
        headers: { authorization: `Bearer ${key}` },
      }).then((r) => r.json());
      running = listed.terminals.filter((t) => t.running).length;
      if (running) await new Promise((done) => setTimeout(done, 200));
    }
    steps.terminal = { route: true, screen, running_after_close: running };
  } else {
    await page.locator("#terminal-note", { hasText: "no terminals" }).waitFor();
    steps.terminal = { route: false, note: await page.locator("#terminal-note").textContent() };
  }
  steps.terminal.fits = await fits("terminal");
  if (!hasTerminals) await shot("terminal");

  // 7. Its preview links (only where the server has the preview route).
  await page.getByRole("link", { name: "Preview links" }).click();
  await page.getByLabel("Port").fill("8000");
  await page.getByLabel("Lifetime (seconds)").fill("600");
  await page.getByRole("button", { name: "Create link" }).click();
  if (hasPreviews) {
    const linkRow = page.locator("#preview-table tbody tr", { hasText: "8000" });
    await linkRow.getByRole("link").waitFor();
    const url = await linkRow.getByRole("link").getAttribute("href");
    await shot("preview");
    await linkRow.getByRole("button", { name: /Revoke/ }).click();
    await page.locator("#preview-table tbody", { hasText: "No links made in this tab." }).waitFor();
    steps.preview = { route: true, url };
  } else {
    await page.locator("#preview-note", { hasText: "no preview links" }).waitFor();
    steps.preview = { route: false, note: await page.locator("#preview-note").textContent() };
    await shot("preview");
  }

  // 8. Its snapshots.
  await page.getByRole("link", { name: "Snapshots" }).click();
  await page.getByLabel("Name (optional)").fill("from-the-console");
  await page.getByRole("button", { name: "Take a snapshot" }).click();
  const snapshotRow = page.locator("#snapshots-table tbody tr", { hasText: "from-the-console" });
  await snapshotRow.waitFor({ timeout: 60_000 });
  steps.snapshots = { row: await snapshotRow.innerText(), fits: await fits("snapshots") };
  await shot("snapshots");

  // 9. The audit tail and its verdict.
  await page.getByRole("link", { name: "Audit" }).click();
  await page.locator("#verdict[data-verdict]").waitFor();
  await page.locator("#audit-table tbody tr", { hasText: "ensure" }).first().waitFor();
  steps.audit = {
    verdict: await page.locator("#verdict").getAttribute("data-verdict"),
    verdict_text: await page.locator("#verdict").textContent(),
    rows: await page.locator("#audit-table tbody tr").count(),
    newest: await page.locator("#audit-table tbody tr").first().innerText(),
    fits: await fits("audit"),
  };
  await shot("audit");

  // 10. The policy.
  await page.getByRole("link", { name: "Policy" }).click();
  await page.locator("#policy-table tbody tr", { hasText: "Session sandboxes" }).waitFor();
  steps.policy = { table: await page.locator("#policy-table tbody").innerText(), fits: await fits("policy") };
  await shot("policy");

  // 11. A reload keeps the tab signed in (sessionStorage); another tab of the same browser
  // is not (sessionStorage is per tab); signing out forgets the key.
  await page.reload({ waitUntil: "load" });
  await page.locator("#policy-table tbody tr", { hasText: "Session sandboxes" }).waitFor();
  const other = await context.newPage();
  await other.goto(`${base}/console`, { waitUntil: "load" });
  await other.getByLabel("Service key").waitFor();
  steps.other_tab = { sign_in_shown: await other.getByLabel("Service key").isVisible() };
  await other.close();
  await page.getByRole("button", { name: "Sign out" }).click();
  await page.getByLabel("Service key").waitFor();
  steps.signed_out = { stored: await storage() };
} finally {
  await browser.close();
}
process.stdout.write(JSON.stringify({ steps, shots, problems }) + "\n");
