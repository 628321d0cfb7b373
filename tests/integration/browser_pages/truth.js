// Streams a reply through hopmeter and writes each read's text at a known time, by one of three
// routes chosen at random: a timer task, an animation-frame callback or a microtask. `truth`
// lists, per write, when it happened (epoch ms, the page's clock), the characters the element
// showed after it and the route, so a test can compare the screen lane hopmeter built with what was written.
// truth.html?s=SCENARIO&seed=N
"use strict";
const q = new URLSearchParams(location.search);
let seed = +(q.get("seed") || 1);
const rand = () => (seed = (seed * 1103515245 + 12345) % 2147483648) / 2147483648;
const now = () => performance.timeOrigin + performance.now();
const state = (window.page = { done: false, error: null, truth: [] });
const node = document.getElementById("reply").appendChild(document.createTextNode(""));
function write(text, route) {
  node.appendData(text);
  state.truth.push([now(), hopmeter.count(node.data)[0], route]);
}
function later(text) { // resolves once written
  const route = Math.floor(rand() * 3);
  return new Promise((done) => {
    const go = () => { write(text, ["timer", "frame", "microtask"][route]); done(); };
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
  const reader = res.body.getReader(), dec = new TextDecoder();
  let buf = "";
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    buf += dec.decode(value, { stream: true });
    const events = buf.split("\n\n");
    buf = events.pop();
    let text = "";
    for (const e of events) {
      const data = e.startsWith("data: ") ? e.slice(6) : "";
      const choice = data && data !== "[DONE]" ? JSON.parse(data).choices[0] : null;
      if (choice && choice.delta.content) text += choice.delta.content;
    }
    if (text) await later(text);
  }
})().then(() => { state.done = true; }, (e) => { state.error = String(e); state.done = true; });
