// Streams a reply through hopmeter and writes each read's text at a known time, by one of three
// routes chosen at random: a timer task, an animation-frame callback or a microtask. `truth`
// lists, per write, when it happened (epoch ms, the page's clock), the characters the element
// showed after it, the route, and the answer characters a correct decoder had read by then, so a
// test can compare the screen lane hopmeter built with what was written.
// truth.html?s=SCENARIO&seed=N[&decoder=chunk: a new TextDecoder for each read, as a buggy
// client does: U+FFFD for every piece of a character split between reads]
"use strict";
const q = new URLSearchParams(location.search);
let seed = +(q.get("seed") || 1);
const rand = () => (seed = (seed * 1103515245 + 12345) % 2147483648) / 2147483648;
const now = () => performance.timeOrigin + performance.now();
const state = (window.page = { done: false, error: null, truth: [] });
const node = document.getElementById("reply").appendChild(document.createTextNode(""));
const perChunk = q.get("decoder") === "chunk";
function write(text, route, right) {
  node.appendData(text);
  state.truth.push([now(), hopmeter.count(node.data)[0], route, right]);
}
function later(text, right) { // resolves once written
  const route = Math.floor(rand() * 3);
  return new Promise((done) => {
    const go = () => { write(text, ["timer", "frame", "microtask"][route], right); done(); };
    setTimeout(() => {
      if (route === 0) go();
      else if (route === 1) requestAnimationFrame(go);
      else Promise.resolve().then(go);
    }, 2 + rand() * 40);
  });
}
(async () => {
  const res = await fetch("/v1/chat/completions", {
    method: "POST",
    headers: { "content-type": "application/json", "x-hopmeter-scenario": q.get("s") || "tokens=80;rate=40;jitter=0.5" },
    body: JSON.stringify({ model: "demo-1", stream: true, messages: [{ role: "user", content: "hi" }] }),
  });
  const reader = res.body.getReader(), dec = new TextDecoder(), ok = new TextDecoder();
  let buf = "", okBuf = "", right = 0;
  const texts = (b) => { // the events complete in b: their text, and what is left over
    const events = b.split("\n\n"), rest = events.pop();
    let text = "";
    for (const e of events) {
      const data = e.startsWith("data: ") ? e.slice(6) : "";
      const choice = data && data !== "[DONE]" ? JSON.parse(data).choices[0] : null;
      if (choice && choice.delta.content) text += choice.delta.content;
    }
    return [text, rest];
  };
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    buf += perChunk ? new TextDecoder().decode(value) : dec.decode(value, { stream: true });
    okBuf += ok.decode(value, { stream: true });
    const [text, rest] = texts(buf);
    const [okText, okRest] = texts(okBuf);
    buf = rest; okBuf = okRest;
    right += hopmeter.count(okText)[0];
    if (text) await later(text, right);
  }
})().then(() => { state.done = true; }, (e) => { state.error = String(e); state.done = true; });
