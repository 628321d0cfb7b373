// hopmeter's demo chat page: one good client and each bad one from the "Where to look first"
// table of "GPU to pixel", streaming from the demo upstream through hopmeter. hopmeter's
// snippet (/_hopmeter/beacon.js, served when the proxy runs with --browser) times what each
// client's reader got and what each frame painted, and hopmeter names what the client did.
// demo.html?client=NAME runs one reply at once (?client=all: each in turn); &s=KEY=VALUE;...
// sets the demo upstream's scenario (docs: README, "The demo upstream").
"use strict";
const params = new URLSearchParams(location.search);
const log = document.getElementById("replies");
const state = (window.demo = { started: 0, done: 0, errors: [] });

// name -> [what it does, the scenario it asks the demo upstream for]
const CLIENTS = {
  good: ["one TextDecoder with stream: true, CR/LF/CRLF, one write per frame", "tokens=120;rate=50;emoji=1;split_writes=1"],
  decoder_per_chunk: ["a new TextDecoder for each chunk", "tokens=120;rate=50;emoji=1;split_writes=1"],
  split_nn: ['splits events on "\\n\\n" only', "tokens=120;rate=50;line_ending=crlf"],
  reparse: ["re-renders the whole message as Markdown every frame", "tokens=500;rate=100"],
  per_token: ["one page write per token", "tokens=300;rate=200"],
  reveal_after_end: ["waits for the whole answer, then reveals it word by word", "tokens=120;rate=50"],
  smooth: ["shows each token 100 ms after it came (a playout buffer)", "tokens=120;rate=50;jitter=0.8"],
};

// One decoder per stream; CR, LF and CRLF all end a line; yields each event's data.
async function* events(body, decodeEachChunkAlone) {
  const reader = body.getReader();
  const dec = new TextDecoder();
  let buf = "", lines = [];
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    buf += decodeEachChunkAlone ? new TextDecoder().decode(value) : dec.decode(value, { stream: true });
    let cut;
    while ((cut = buf.search(/[\r\n]/)) >= 0) {
      if (buf[cut] === "\r" && cut === buf.length - 1) break; // may be the CR of a CRLF
      const line = buf.slice(0, cut);
      buf = buf.slice(cut + (buf.startsWith("\r\n", cut) ? 2 : 1));
      if (line === "") {
        if (lines.length) yield lines.join("\n");
        lines = [];
      } else if (line.startsWith("data:")) lines.push(line.slice(line[5] === " " ? 6 : 5));
    }
  }
}
const deltaText = (data) => {
  if (data === "[DONE]") return "";
  const c = JSON.parse(data).choices;
  return (c && c[0] && c[0].delta && c[0].delta.content) || "";
};

// Text collected between frames, written once per frame.
function frameWriter(node) {
  let pending = "", queued = false;
  return (text) => {
    pending += text;
    if (queued || !text) return;
    queued = true;
    requestAnimationFrame(() => {
      queued = false;
      node.appendData(pending);
      pending = "";
    });
  };
}

function markdown(src) { // the whole message, every time: the anti-pattern this client shows
  const esc = src.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
  return esc.split(/\n{2,}/).map((block) => {
    const html = block.replace(/\*\*(.+?)\*\*/g, "<b>$1</b>").replace(/`([^`]+)`/g, "<code>$1</code>");
    // a renderer that wraps every word (highlighting, links, citations): work per character
    return "<p>" + html.replace(/(\S+)/g, '<span class="w">$1</span>') + "</p>";
  }).join("");
}

const RUN = {
  async good(res, el) {
    const write = frameWriter(el.appendChild(document.createTextNode("")));
    for await (const data of events(res.body)) write(deltaText(data));
  },
  async decoder_per_chunk(res, el) {
    const write = frameWriter(el.appendChild(document.createTextNode("")));
    for await (const data of events(res.body, true)) write(deltaText(data));
  },
  async split_nn(res, el) {
    const write = frameWriter(el.appendChild(document.createTextNode("")));
    const reader = res.body.getReader(), dec = new TextDecoder();
    let buf = "";
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      buf += dec.decode(value, { stream: true });
      const parts = buf.split("\n\n");
      buf = parts.pop();
      for (const p of parts) if (p.startsWith("data: ")) write(deltaText(p.slice(6)));
    }
  },
  async reparse(res, el) { // batched per frame, so that only this bug shows
    let full = "", queued = false;
    for await (const data of events(res.body)) {
      full += deltaText(data);
      if (queued) continue;
      queued = true;
      requestAnimationFrame(() => {
        queued = false;
        el.innerHTML = markdown(full);
      });
    }
    await new Promise((ok) => requestAnimationFrame(() => { el.innerHTML = markdown(full); ok(); }));
  },
  async per_token(res, el) {
    const node = el.appendChild(document.createTextNode(""));
    for await (const data of events(res.body)) {
      const t = deltaText(data);
      if (t) node.appendData(t);
    }
  },
  async reveal_after_end(res, el) {
    const text = await res.text();
    let full = "";
    for (const block of text.split(/\r\n\r\n|\n\n|\r\r/)) {
      const m = /^data: (.*)$/m.exec(block);
      if (m) full += deltaText(m[1]);
    }
    const node = el.appendChild(document.createTextNode(""));
    for (const word of full.match(/\s*\S+/g) || []) {
      node.appendData(word);
      await new Promise((ok) => setTimeout(ok, 30));
    }
  },
  async smooth(res, el) {
    const write = frameWriter(el.appendChild(document.createTextNode("")));
    let last = Promise.resolve();
    for await (const data of events(res.body)) {
      const t = deltaText(data);
      if (t) last = new Promise((ok) => setTimeout(() => { write(t); ok(); }, 100));
    }
    await last;
  },
};

async function reply(name, scenario) {
  const bubble = document.createElement("div");
  bubble.className = "reply";
  const title = document.createElement("p");
  title.className = "who";
  title.textContent = `${name}: ${CLIENTS[name][0]}`;
  const el = document.createElement("div");
  el.className = "bubble";
  el.setAttribute("data-hopmeter-reply", name === "reparse" ? "" : "text");
  bubble.append(title, el);
  log.prepend(bubble);
  state.started++;
  try {
    const res = await fetch("/v1/chat/completions", {
      method: "POST",
      headers: { "content-type": "application/json", "x-hopmeter-scenario": scenario || CLIENTS[name][1] },
      body: JSON.stringify({ model: "demo-1", stream: true, messages: [{ role: "user", content: "hello" }] }),
    });
    await RUN[name](res, el);
  } catch (e) {
    state.errors.push(`${name}: ${e}`);
    console.error(e);
  }
  state.done++;
}

const picker = document.getElementById("clients");
for (const [name, [what]] of Object.entries(CLIENTS)) {
  const b = document.createElement("button");
  b.textContent = name;
  b.title = what;
  b.addEventListener("click", () => reply(name));
  picker.append(b);
}
document.getElementById("snippet").textContent = window.hopmeter
  ? "hopmeter's snippet is loaded: each reply's beacon goes to hopmeter."
  : "hopmeter's snippet did not load: run the proxy with --browser (hopmeter demo --browser).";

(async () => {
  const want = params.get("client");
  if (!want) return;
  for (const name of want === "all" ? Object.keys(CLIENTS) : want.split(",")) {
    if (!RUN[name]) { state.errors.push(`no client ${name}`); continue; }
    await reply(name, params.get("s"));
    if (want === "all") await new Promise((ok) => setTimeout(ok, 1500)); // one beacon at a time
  }
})();
