// A page that streams with the AI SDK as an app does: an OpenAI-compatible provider pointed at
// this origin, streamText with smoothStream (word chunking, 10 ms), one write per frame.
// ai-sdk.html?s=SCENARIO (the demo upstream's X-Hopmeter-Scenario).
"use strict";
const scenario = new URLSearchParams(location.search).get("s") || "tokens=60;rate=50;jitter=0.8";
const state = (window.page = { done: false, error: null });
const { streamText, smoothStream, createOpenAICompatible } = window.aiSdk;
const provider = createOpenAICompatible({
  name: "demo",
  baseURL: location.origin + "/v1",
  apiKey: "none",
  headers: { "x-hopmeter-scenario": scenario },
});
const node = document.getElementById("reply").appendChild(document.createTextNode(""));
let pending = "", queued = false;
function write(text) {
  pending += text;
  if (queued) return;
  queued = true;
  requestAnimationFrame(() => { queued = false; node.appendData(pending); pending = ""; });
}
(async () => {
  const result = streamText({
    model: provider("demo-1"),
    prompt: "hello",
    experimental_transform: smoothStream({ delayInMs: 10, chunking: "word" }),
  });
  for await (const text of result.textStream) write(text);
})().then(() => { state.done = true; }, (e) => { state.error = String(e); state.done = true; });
