// An in-page terminal on a sandbox's terminal route, drawn by xterm.js:
//   POST …/terminals {cols, rows} -> {id}; POST …/terminals/{tid}/tickets -> {ticket};
//   WebSocket …/terminals/{tid}?access_token=TICKET: binary messages are the terminal's
//   bytes both ways; text JSON control: {"type":"resize",cols,rows} in, {"type":"exit",exit_code} out.
import { Terminal } from "/console/vendor/xterm.mjs";

export class TerminalSession {
  /** Opens a terminal in sandbox `sandbox` and draws it in `element`; `note(text)` reports. */
  static async open(api, sandbox, element, note) {
    const term = new Terminal({ cols: 100, rows: 24, convertEol: false, cursorBlink: true, scrollback: 2000 });
    const base = api.orgPath(`/sandboxes/${encodeURIComponent(sandbox)}/terminals`);
    const made = await api.post(base, { cols: term.cols, rows: term.rows });
    const { ticket } = await api.post(`${base}/${encodeURIComponent(made.id)}/tickets`, {});
    const scheme = location.protocol === "https:" ? "wss:" : "ws:";
    const url = `${scheme}//${location.host}${base}/${encodeURIComponent(made.id)}?access_token=${encodeURIComponent(ticket)}`;
    element.replaceChildren();
    term.open(element);
    const socket = new WebSocket(url);
    socket.binaryType = "arraybuffer";
    const session = new TerminalSession(term, socket, made.id, () =>
      api.json("DELETE", `${base}/${encodeURIComponent(made.id)}`),
    );
    const encoder = new TextEncoder();
    socket.addEventListener("open", () => {
      note("Connected. The terminal has the keyboard; press Ctrl+] to give it back to the page.");
      term.focus();
    });
    socket.addEventListener("message", (event) => {
      if (typeof event.data === "string") {
        let message;
        try {
          message = JSON.parse(event.data);
        } catch {
          return;
        }
        if (message.type === "exit" && !session.closing) {
          session.exitCode = message.exit_code;
          note(`The terminal's shell exited with status ${message.exit_code}.`);
        }
        return;
      }
      term.write(new Uint8Array(event.data));
    });
    // Once the page closes the terminal itself, its socket's end says nothing more.
    socket.addEventListener("close", () => {
      session.closed = true;
      if (session.exitCode === undefined && !session.closing) note("The terminal's connection closed.");
    });
    socket.addEventListener("error", () => {
      if (!session.closing) note("The terminal's connection failed.");
    });
    term.onData((data) => {
      if (socket.readyState === WebSocket.OPEN) socket.send(encoder.encode(data));
    });
    term.onBinary((data) => {
      if (socket.readyState === WebSocket.OPEN) socket.send(Uint8Array.from(data, (c) => c.charCodeAt(0)));
    });
    term.onResize(({ cols, rows }) => {
      if (socket.readyState === WebSocket.OPEN) socket.send(JSON.stringify({ type: "resize", cols, rows }));
    });
    // Keyboard users leave the terminal with Ctrl+] (Tab is the shell's there).
    term.attachCustomKeyEventHandler((event) => {
      if (event.type === "keydown" && event.ctrlKey && event.key === "]") {
        document.getElementById("terminal-close")?.focus();
        return false;
      }
      return true;
    });
    return session;
  }

  constructor(term, socket, id, end) {
    this.end = end;
    this.term = term;
    this.socket = socket;
    this.id = id;
    this.closed = false;
    this.closing = false;
    this.exitCode = undefined;
  }

  /** The text on the terminal's screen, line by line (what a test reads). */
  screen() {
    const buffer = this.term.buffer.active;
    const lines = [];
    for (let i = 0; i < buffer.length; i++) lines.push(buffer.getLine(i)?.translateToString(true) ?? "");
    return lines.join("\n");
  }

  /** Closes the connection and ends the terminal's shell (best effort: it may be gone). */
  close() {
    this.closing = true;
    try {
      this.socket.close();
    } catch {
      // already closed
    }
    this.term.dispose();
    this.end().catch(() => {});
  }
}
