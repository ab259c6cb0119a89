// The sandlane console: every view is a call to the public API with the tab's service key.
import { Api, ApiError, forget, saved } from "/console/api.js";
import { TerminalSession } from "/console/terminal.js";

const $ = (id) => document.getElementById(id);
let api = saved();
let terminal = null;

// ---- messages -------------------------------------------------------------------------

function say(text) {
  $("status").textContent = text;
}

function count(n, one, many = `${one}s`) {
  return `${n} ${n === 1 ? one : many}`;
}

function fail(error) {
  const box = $("error");
  box.textContent = error instanceof ApiError ? error.describe() : String(error?.message ?? error);
  box.hidden = false;
}

function clearError() {
  $("error").hidden = true;
  $("error").textContent = "";
}

/** Runs `work`, showing its failure; answers whether it succeeded. */
async function attempt(work) {
  clearError();
  try {
    await work();
    return true;
  } catch (error) {
    if (error instanceof ApiError && error.status === 401 && api) {
      fail(error);
      signOut(false);
      return false;
    }
    fail(error);
    return false;
  }
}

/** Whether an error says the server has no such route (a server without that feature yet). */
function missingRoute(error) {
  return error instanceof ApiError && error.status === 404 && /^no route for /.test(error.message);
}

// ---- small DOM helpers ----------------------------------------------------------------

function cell(content, header = false) {
  const td = document.createElement(header ? "th" : "td");
  if (header) td.scope = "row";
  if (content instanceof Node) td.append(content);
  else td.textContent = content ?? "";
  if (typeof content === "string" && content.length <= 16 && !/[\s_]/.test(content)) td.className = "word";
  return td;
}

function row(...cells) {
  const tr = document.createElement("tr");
  tr.append(...cells);
  return tr;
}

function emptyRow(table, text) {
  const td = document.createElement("td");
  td.colSpan = table.tHead.rows[0].cells.length;
  td.textContent = text;
  td.className = "empty";
  return row(td);
}

function link(text, href) {
  const a = document.createElement("a");
  a.href = href;
  a.textContent = text;
  return a;
}

function button(text, onClick, label) {
  const b = document.createElement("button");
  b.type = "button";
  b.textContent = text;
  if (label) b.setAttribute("aria-label", label);
  b.addEventListener("click", onClick);
  return b;
}

function age(rfc3339) {
  const seconds = Math.max(0, (Date.now() - Date.parse(rfc3339)) / 1000);
  if (seconds < 60) return `${Math.floor(seconds)} s`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)} min`;
  if (seconds < 86400) return `${Math.floor(seconds / 3600)} h`;
  return `${Math.floor(seconds / 86400)} d`;
}

function bytes(n) {
  if (n === null || n === undefined) return "unlimited";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  let v = n;
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  return `${Number.isInteger(v) ? v : v.toFixed(1)} ${units[i]}`;
}

function duration(ms) {
  if (ms === null || ms === undefined) return "off";
  if (ms % 3600000 === 0) return `${ms / 3600000} h`;
  if (ms % 60000 === 0) return `${ms / 60000} min`;
  if (ms % 1000 === 0) return `${ms / 1000} s`;
  return `${ms} ms`;
}

function when(rfc3339) {
  const time = document.createElement("time");
  time.dateTime = rfc3339;
  time.textContent = rfc3339.replace("T", " ").replace(/\.\d+Z$/, "Z");
  return time;
}

// ---- signing in -----------------------------------------------------------------------

$("sign-in-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const candidate = new Api($("org").value.trim(), $("key").value.trim());
  say("Checking the key…");
  clearError();
  try {
    // A service caller of the org may read its policy; anyone else is refused.
    await candidate.get(candidate.orgPath("/policy"));
  } catch (error) {
    say("");
    if (error instanceof ApiError && error.status === 403) {
      fail(new ApiError(403, error.code, `this key is not a service caller of org ${candidate.org}: ${error.message}`));
    } else {
      fail(error);
    }
    $("key").focus();
    return;
  }
  $("key").value = "";
  api = candidate;
  api.remember();
  say(`Signed in to org ${api.org}.`);
  showApp();
  if (!location.hash || location.hash === "#") location.hash = "#/sandboxes";
  else route();
});

function signOut(announce = true) {
  forget();
  api = null;
  closeTerminal();
  $("app").hidden = true;
  $("sign-in").hidden = false;
  $("who").hidden = true;
  $("sign-out").hidden = true;
  if (announce) say("Signed out; the key is gone from this tab.");
  $("org").focus();
}

$("sign-out").addEventListener("click", () => signOut());

function showApp() {
  $("sign-in").hidden = true;
  $("app").hidden = false;
  $("who").textContent = `Org ${api.org}`;
  $("who").hidden = false;
  $("sign-out").hidden = false;
}

// ---- routing --------------------------------------------------------------------------

function route() {
  if (!api) return;
  clearError();
  say("");
  const parts = location.hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
  for (const view of document.querySelectorAll(".view")) view.hidden = true;
  for (const a of document.querySelectorAll("nav.tabs a")) a.removeAttribute("aria-current");
  const [view, id, panel] = parts;
  if (view === "audit") {
    showView("audit");
    loadAudit();
  } else if (view === "policy") {
    showView("policy");
    loadPolicy();
  } else if (view === "sandboxes" && id) {
    showView("sandbox", "sandboxes");
    openSandbox(id, panel || "processes");
  } else {
    showView("sandboxes");
    loadSandboxes();
  }
}

function showView(name, nav = name) {
  $(`view-${name}`).hidden = false;
  $(`nav-${nav}`)?.setAttribute("aria-current", "page");
}

window.addEventListener("hashchange", route);

// ---- sandboxes ------------------------------------------------------------------------

const pages = { cursors: [null], index: 0, next: null };

function resetPages() {
  pages.cursors = [null];
  pages.index = 0;
  pages.next = null;
}

async function loadSandboxes() {
  await attempt(async () => {
    const table = $("sandboxes-table");
    const body = table.tBodies[0];
    const limit = Number($("page-size").value);
    const answer = await api.get(api.orgPath("/sandboxes"), {
      after: pages.cursors[pages.index],
      limit,
      ended: $("show-ended").checked ? "true" : undefined,
    });
    pages.next = answer.next;
    body.replaceChildren(
      ...answer.sandboxes.map((s) =>
        row(
          cell(link(s.id, `#/sandboxes/${encodeURIComponent(s.id)}`), true),
          cell(`${s.kind} ${s.key}`),
          cell(s.state),
          cell(s.owner ? `${s.owner} (${s.owner_class})` : "none"),
          cell(s.durability),
          cell(age(s.created_at)),
          cell(s.driver),
        ),
      ),
    );
    if (!answer.sandboxes.length) body.append(emptyRow(table, "No sandboxes."));
    const first = pages.index * limit + 1;
    $("page-label").textContent = answer.sandboxes.length
      ? `Page ${pages.index + 1}: sandboxes ${first} to ${first + answer.sandboxes.length - 1}`
      : `Page ${pages.index + 1}`;
    $("page-prev").disabled = pages.index === 0;
    $("page-first").disabled = pages.index === 0;
    $("page-next").disabled = !answer.next;
    say(`${count(answer.sandboxes.length, "sandbox", "sandboxes")} on this page.`);
  });
}

$("page-next").addEventListener("click", () => {
  if (!pages.next) return;
  pages.cursors[pages.index + 1] = pages.next;
  pages.index++;
  loadSandboxes();
});
$("page-prev").addEventListener("click", () => {
  if (pages.index > 0) pages.index--;
  loadSandboxes();
});
$("page-first").addEventListener("click", () => {
  resetPages();
  loadSandboxes();
});
$("sandboxes-refresh").addEventListener("click", loadSandboxes);
$("show-ended").addEventListener("change", () => {
  resetPages();
  loadSandboxes();
});
$("page-size").addEventListener("change", () => {
  resetPages();
  loadSandboxes();
});

// ---- one sandbox ----------------------------------------------------------------------

let current = null; // the sandbox shown
const previews = new Map(); // sandbox id -> links made in this tab

function sandboxPath(rest = "") {
  return api.orgPath(`/sandboxes/${encodeURIComponent(current)}${rest}`);
}

async function openSandbox(id, panel) {
  if (current !== id) closeTerminal();
  current = id;
  $("sandbox-title").textContent = `Sandbox ${id}`;
  for (const a of $("panel-tabs").querySelectorAll("a")) {
    a.href = `#/sandboxes/${encodeURIComponent(id)}/${a.dataset.panel}`;
    if (a.dataset.panel === panel) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  for (const p of document.querySelectorAll(".panel")) p.hidden = true;
  const section = $(`panel-${panel}`) ?? $("panel-processes");
  section.hidden = false;
  await attempt(async () => {
    const s = await api.get(sandboxPath());
    const facts = [
      ["Kind", s.kind],
      ["Key", s.key],
      ["State", s.state],
      ["Durability", s.durability],
      ["Driver", s.driver],
      ["Created", s.created_at],
    ];
    $("sandbox-facts").replaceChildren(
      ...facts.flatMap(([k, v]) => {
        const dt = document.createElement("dt");
        dt.textContent = k;
        const dd = document.createElement("dd");
        dd.textContent = v;
        return [dt, dd];
      }),
    );
  });
  if (panel === "files") loadFiles($("files-path").value || "/workspace");
  else if (panel === "terminal") terminalPanel();
  else if (panel === "preview") renderPreviews();
  else if (panel === "snapshots") loadSnapshots();
  else loadProcesses();
}

// processes

async function loadProcesses() {
  await attempt(async () => {
    const table = $("processes-table");
    const { processes } = await api.get(sandboxPath("/processes"));
    table.tBodies[0].replaceChildren(
      ...processes.map((p) => {
        const actions = document.createElement("div");
        actions.className = "actions";
        actions.append(button("Output", () => showOutput(p.pid), `Output of process ${p.pid}`));
        if (p.running) {
          actions.append(
            button("Stop", () => signal(p.pid, "TERM"), `Stop process ${p.pid} (TERM)`),
            button("Kill", () => signal(p.pid, "KILL"), `Kill process ${p.pid}`),
          );
        }
        return row(
          cell(String(p.pid), true),
          cell(p.terminal ? `${p.argv.join(" ")} (terminal ${p.terminal})` : p.argv.join(" ")),
          cell(p.running ? "running" : p.timed_out ? "timed out" : "ended"),
          cell(p.exit_code === null ? "" : String(p.exit_code)),
          cell(actions),
        );
      }),
    );
    if (!processes.length) table.tBodies[0].append(emptyRow(table, "No background processes."));
    say(`${count(processes.length, "process", "processes")}.`);
  });
}

async function signal(pid, name) {
  if (await attempt(() => api.post(sandboxPath(`/processes/${pid}/signal`), { signal: name }))) {
    say(`Sent ${name} to process ${pid}.`);
    loadProcesses();
  }
}

function decodeFrame(frame) {
  if (typeof frame.text === "string") return frame.text;
  if (typeof frame.data === "string") {
    const raw = atob(frame.data);
    return new TextDecoder().decode(Uint8Array.from(raw, (c) => c.charCodeAt(0)));
  }
  return "";
}

async function showOutput(pid) {
  await attempt(async () => {
    const response = await api.raw("GET", sandboxPath(`/processes/${pid}/output`), { accept: "application/x-ndjson" });
    let out = "";
    for (const line of (await response.text()).split("\n")) {
      if (!line.trim()) continue;
      const frame = JSON.parse(line);
      if (frame.type === "stdout" || frame.type === "stderr") out += decodeFrame(frame);
      else if (frame.type === "exit") out += `\n[exit ${frame.exit_code}]`;
      else if (frame.type === "error") out += `\n[${frame.error}: ${frame.message}]`;
    }
    $("output-title").textContent = `Output of process ${pid}`;
    $("output-title").hidden = false;
    $("process-output").hidden = false;
    $("process-output").textContent = out || "(no output yet)";
  });
}

$("process-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const command = $("process-command").value;
  let started;
  if (await attempt(async () => (started = await api.post(sandboxPath("/processes"), { argv: ["sh", "-c", command] })))) {
    say(`Started process ${started.pid}.`);
    loadProcesses();
  }
});
$("processes-refresh").addEventListener("click", loadProcesses);

// files

function parentOf(path) {
  const trimmed = path.replace(/\/+$/, "");
  const cut = trimmed.lastIndexOf("/");
  return cut <= 0 ? "/" : trimmed.slice(0, cut);
}

function join(dir, name) {
  return `${dir.replace(/\/+$/, "")}/${name}`;
}

async function loadFiles(path) {
  $("files-path").value = path;
  await attempt(async () => {
    const response = await api.raw("GET", sandboxPath("/files"), { query: { path } });
    const type = response.headers.get("content-type") ?? "";
    if (!type.startsWith("application/json")) {
      // A file: show its start as text.
      const data = new Uint8Array(await response.arrayBuffer());
      const shown = data.slice(0, 256 * 1024);
      $("file-title").textContent = `File ${path} (${bytes(data.length)}${data.length > shown.length ? ", the first 256 KiB" : ""})`;
      $("file-title").hidden = false;
      $("file-content").hidden = false;
      $("file-content").textContent = new TextDecoder().decode(shown);
      say(`Opened the file ${path}.`);
      return;
    }
    const { entries } = await response.json();
    const table = $("files-table");
    $("files-caption").textContent = `Entries of ${path}`;
    table.tBodies[0].replaceChildren(
      ...entries.map((e) => {
        const name =
          e.type === "directory" || e.type === "file"
            ? button(e.type === "directory" ? `${e.name}/` : e.name, () => loadFiles(join(path, e.name)), `Open ${e.type} ${e.name}`)
            : document.createTextNode(e.name);
        name.className = "link-like";
        return row(cell(name, true), cell(e.type), cell(bytes(e.size)));
      }),
    );
    if (!entries.length) table.tBodies[0].append(emptyRow(table, "An empty directory."));
    $("file-title").hidden = true;
    $("file-content").hidden = true;
    say(`${count(entries.length, "entry", "entries")} in ${path}.`);
  });
}

$("files-form").addEventListener("submit", (event) => {
  event.preventDefault();
  loadFiles($("files-path").value.trim());
});
$("files-up").addEventListener("click", () => loadFiles(parentOf($("files-path").value.trim())));

// terminal

function terminalNote(text) {
  $("terminal-note").textContent = text;
}

function terminalPanel() {
  if (!terminal) terminalNote("Open a terminal to run a shell in the sandbox.");
}

function closeTerminal() {
  if (terminal) {
    terminal.close();
    terminal = null;
  }
  if ($("terminal-close")) $("terminal-close").disabled = true;
}

$("terminal-open").addEventListener("click", async () => {
  closeTerminal();
  clearError();
  terminalNote("Opening…");
  try {
    terminal = await TerminalSession.open(api, current, $("terminal"), terminalNote);
    $("terminal-close").disabled = false;
  } catch (error) {
    if (missingRoute(error)) {
      terminalNote("This server has no terminals yet (its API answers 404 to the terminal route).");
    } else {
      terminalNote("");
      fail(error);
    }
  }
});
$("terminal-close").addEventListener("click", () => {
  closeTerminal();
  terminalNote("Closed.");
  $("terminal-open").focus();
});

// preview links

function renderPreviews() {
  const table = $("preview-table");
  const links = previews.get(current) ?? [];
  table.tBodies[0].replaceChildren(
    ...links.map((l) => {
      const a = link(l.url, l.url);
      a.target = "_blank";
      a.rel = "noopener noreferrer";
      return row(
        cell(String(l.port), true),
        cell(a),
        cell(l.expires_at),
        cell(button("Revoke", () => revokePreview(l), `Revoke the link to port ${l.port}`)),
      );
    }),
  );
  if (!links.length) table.tBodies[0].append(emptyRow(table, "No links made in this tab."));
}

async function revokePreview(l) {
  const ok = await attempt(async () => {
    try {
      await api.json("DELETE", sandboxPath(`/ports/${l.port}/links/${encodeURIComponent(l.id)}`));
    } catch (error) {
      if (!(error instanceof ApiError && error.status === 404) || missingRoute(error)) throw error;
    }
  });
  if (ok) {
    previews.set(current, (previews.get(current) ?? []).filter((x) => x.id !== l.id));
    say(`Revoked the link to port ${l.port}.`);
    renderPreviews();
  }
}

$("preview-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  clearError();
  const port = Number($("preview-port").value);
  const ttl = Number($("preview-ttl").value);
  try {
    const made = await api.post(sandboxPath(`/ports/${port}/links`), { ttl_s: ttl });
    previews.set(current, [...(previews.get(current) ?? []), { ...made, port }]);
    $("preview-note").textContent = `Made a link to port ${port}.`;
    renderPreviews();
  } catch (error) {
    if (missingRoute(error)) {
      $("preview-note").textContent = "This server has no preview links yet (its API answers 404 to the preview route).";
    } else {
      fail(error);
    }
  }
});

// snapshots

async function loadSnapshots() {
  await attempt(async () => {
    const table = $("snapshots-table");
    const { snapshots } = await api.get(api.orgPath("/snapshots"), { sandbox_id: current });
    table.tBodies[0].replaceChildren(
      ...snapshots.map((s) =>
        row(cell(s.id, true), cell(s.name ?? ""), cell(when(s.created_at)), cell(s.created_by), cell(bytes(s.bytes))),
      ),
    );
    if (!snapshots.length) table.tBodies[0].append(emptyRow(table, "No snapshots of this sandbox."));
    say(`${count(snapshots.length, "snapshot")}.`);
  });
}

$("snapshot-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const name = $("snapshot-name").value.trim();
  let taken;
  if (await attempt(async () => (taken = await api.post(sandboxPath("/snapshots"), name ? { name } : {})))) {
    say(`Took snapshot ${taken.id}.`);
    loadSnapshots();
  }
});

// ---- audit ----------------------------------------------------------------------------

const TAIL = 100;
const audit = { org: null, next: 0, events: [] };

async function loadAudit() {
  await attempt(async () => {
    if (audit.org !== api.org) {
      audit.org = api.org;
      audit.next = 0;
      audit.events = [];
    }
    // Follow the log from where this tab stopped reading it, keeping its last TAIL events.
    for (;;) {
      const page = await api.get(api.orgPath("/audit"), { after: audit.next, limit: 1000 });
      audit.events = audit.events.concat(page.events).slice(-TAIL);
      const moved = page.next !== audit.next;
      audit.next = page.next;
      if (page.events.length < 1000 || !moved) break;
    }
    const table = $("audit-table");
    table.tBodies[0].replaceChildren(
      ...audit.events
        .slice()
        .reverse()
        .map((e) =>
          row(
            cell(String(e.seq), true),
            cell(when(e.at)),
            cell(e.action),
            cell(e.message ? `${e.outcome}: ${e.message}` : e.outcome),
            cell(`${e.kind} ${e.key}`),
            cell(e.sandbox_id ?? ""),
            cell(e.caller_id ? `${e.caller_id} (${e.caller_class})` : ""),
            cell(e.sealed ? "yes" : "not yet"),
          ),
        ),
    );
    if (!audit.events.length) table.tBodies[0].append(emptyRow(table, "No events."));
  });
  const verdict = $("verdict");
  verdict.className = "verdict";
  verdict.textContent = "Verifying the audit log…";
  try {
    const v = await api.get(api.orgPath("/audit/verify"));
    verdict.textContent =
      v.verdict === "intact"
        ? `Audit log verified: intact (checked ${v.checked_at}).`
        : `Audit log verified: TAMPERED (checked ${v.checked_at}). ${v.message ?? ""}`;
    verdict.classList.add(v.verdict === "intact" ? "good" : "bad");
    verdict.dataset.verdict = v.verdict;
  } catch (error) {
    verdict.textContent = missingRoute(error)
      ? "This server cannot verify the audit log through its API."
      : `The audit log could not be verified: ${error instanceof ApiError ? error.describe() : error}`;
    verdict.classList.add("bad");
  }
}

$("audit-refresh").addEventListener("click", loadAudit);

// ---- policy ---------------------------------------------------------------------------

async function loadPolicy() {
  await attempt(async () => {
    const p = await api.get(api.orgPath("/policy"));
    const rows = [
      ["lane_session", "Session sandboxes", p.lane_session ? "on" : "off"],
      ["lane_workflow", "Workflow sandboxes", p.lane_workflow ? "on" : "off"],
      ["max_sandboxes", "Running sandboxes at most", p.max_sandboxes ?? "unlimited"],
      ["max_commands", "Concurrent commands in the org", p.max_commands ?? "unlimited"],
      ["max_commands_per_sandbox", "Concurrent commands per sandbox", p.max_commands_per_sandbox ?? "unlimited"],
      ["workspace_bytes", "Workspace size", bytes(p.workspace_bytes)],
      ["idle_timeout_ms", "Suspended when idle for", duration(p.idle_timeout_ms)],
      ["max_lifetime_ms", "Maximum lifetime", duration(p.max_lifetime_ms)],
      ["warm_pool", "Warm sandboxes", p.warm_pool],
      ["egress_allow", "Egress allowed to", p.egress_allow.length ? p.egress_allow.join(", ") : "nothing"],
    ];
    const table = $("policy-table");
    table.tBodies[0].replaceChildren(
      ...rows.map(([field, label, value]) =>
        row(cell(label, true), cell(String(value)), cell(p.overridden.includes(field) ? "yes" : "default")),
      ),
    );
    $("policy-table").caption.textContent = `Settings (version ${p.version}${p.updated_at ? `, changed ${p.updated_at}` : ""})`;
  });
}

// ---- start ----------------------------------------------------------------------------

if (api) {
  $("org").value = api.org;
  showApp();
  route();
} else {
  $("sign-in").hidden = false;
}
