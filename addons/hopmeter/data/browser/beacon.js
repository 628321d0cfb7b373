/*! hopmeter browser snippet (how to use it: hopmeter's docs/browser.md). For each streamed
 * reply it times when the page's body reader got each chunk and when the reply's element changed on
 * screen, and sends one beacon per reply to hopmeter, which joins it to its record of the same
 * request. It sends counts, times and offsets, never the reply's text unless the page opts in
 * (data-send-text). No dependencies, no build step:
 *   <script src="/_hopmeter/beacon.js"></script>   (before the app's own scripts)
 *   <div data-hopmeter-reply>...</div>               (the element that shows the reply)
 * Options, as data-* attributes of the script tag: data-endpoint (default /_hopmeter/beacon),
 * data-match (a regular expression of URLs to trace; default: this origin's POSTs),
 * data-settle (ms the element must stay unchanged after the stream ended, default 1000),
 * data-wait (ms after the end at most, default 10000), data-send-text ("1": send the text).
 * data-hopmeter-reply="text" says the element shows plain text (no Markdown).
 * One call instead of the automatic wrapping: hopmeter.fetch(input, init, element). */
(function () {
  "use strict";
  var W = window, D = document, P = performance;
  if (W.hopmeter && W.hopmeter.v) return;
  var ds = (D.currentScript && D.currentScript.dataset) || {};
  var cfg = {
    endpoint: ds.endpoint || "/_hopmeter/beacon",
    match: ds.match ? new RegExp(ds.match) : null,
    settle: +(ds.settle || 1000),
    wait: +(ds.wait || 10000),
    text: ds.sendText === "1",
  };
  var ATTR = "data-hopmeter-reply";
  var KEEP = 8192; // reads and frames kept per reply in the page (the rest counted)
  var KEEP_BYTES = 8388608; // body bytes kept to count characters after the end (8 MiB)
  var MAX_ENTRIES = 2048; // per list in a beacon (hopmeter refuses more)
  var MAX_BODY = 64000; // a beacon's bytes: sendBeacon refuses over 64 KiB, shared in flight
  var origFetch = W.fetch;
  var now = function () { return P.timeOrigin + P.now(); }; // epoch ms, monotonic in the page
  var hex = function (n) {
    var a = new Uint8Array(n), s = "";
    crypto.getRandomValues(a);
    for (var i = 0; i < n; i++) s += (a[i] + 256).toString(16).slice(1);
    return s;
  };

  // Code points (what Python's len() counts, as hopmeter's content offsets do) and U+FFFD.
  function count(s) {
    var n = s.length, bad = 0;
    for (var i = 0; i < s.length; i++) {
      var c = s.charCodeAt(i);
      if (c >= 0xd800 && c <= 0xdbff && i + 1 < s.length) {
        var d = s.charCodeAt(i + 1);
        if (d >= 0xdc00 && d <= 0xdfff) { n--; i++; }
      } else if (c === 0xfffd) bad++;
    }
    return [n, bad];
  }

  var active = []; // replies not yet sent

  function Reply(tp, url, method) {
    this.tp = tp; this.url = url; this.method = method;
    this.t0 = now();
    this.rt = []; this.rb = []; this.bufs = []; this.bytes = 0; this.lost = 0;
    // frames: layout (painted), raf, write, tasks, removed, chars, fffd
    this.f = { t: [], raf: [], write: [], tasks: [], removed: [], chars: [], fffd: [] };
    this.flost = 0; this.slow = 0; this.first = null;
    this.el = null; this.pend = null; this.lastChange = 0; this.end = null; this.sent = false;
    active.push(this);
    loop();
  }
  Reply.prototype.chunk = function (u8) { // on the app's path: a push, nothing else
    var t = now();
    this.bytes += u8.byteLength;
    if (this.rt.length >= KEEP) { this.lost++; return; }
    this.rt.push(t); this.rb.push(u8.byteLength);
    if (this.bytes <= KEEP_BYTES) this.bufs.push(u8); // counted after the end, off the path
  };
  Reply.prototype.done = function (how) {
    if (this.end) return;
    this.end = { t: now(), how: how };
    this.lastChange = Math.max(this.lastChange, now());
    var self = this;
    setTimeout(function () { self.settle(); }, cfg.settle);
  };
  Reply.prototype.settle = function () {
    if (this.sent) return;
    var t = now();
    if (t - this.lastChange < cfg.settle - 1 && t - this.end.t < cfg.wait) {
      var self = this;
      setTimeout(function () { self.settle(); }, cfg.settle);
      return;
    }
    this.send(this.end.how);
  };
  // Resource Timing: when the request began to leave, and when the response began to come.
  Reply.prototype.timing = function () {
    if (!this.href || !P.getEntriesByName) return null;
    var es = P.getEntriesByName(this.href, "resource"), best = null, t0 = this.t0 - P.timeOrigin;
    for (var i = 0; i < es.length; i++) {
      if (es[i].startTime >= t0 - 1 && (!best || es[i].startTime < best.startTime)) best = es[i];
    }
    if (!best || !best.requestStart) return null;
    return [tick(best.requestStart - t0), best.responseStart ? tick(best.responseStart - t0) : null];
  };
  // What a correct reader makes of the bytes: characters so far after each read. And the answer
  // characters a reader decoding each read alone would show (a U+FFFD for each piece of a
  // character split between reads): what aligns the screen of such a page with its reads.
  Reply.prototype.decode = function () {
    var dec = new TextDecoder(), p = parser(), chars = [], shown = [], all = 0, sh = 0, bad = 0;
    var pa = parser(), alone = [], al = 0, split = false;
    for (var i = 0; i < this.bufs.length; i++) {
      var texts = p(dec.decode(this.bufs[i], { stream: true }));
      for (var j = 0; j < texts.length; j++) {
        var k = count(texts[j][1]);
        all += k[0]; bad += k[1];
        if (texts[j][0]) sh += k[0];
      }
      var ta = pa(new TextDecoder().decode(this.bufs[i]));
      for (j = 0; j < ta.length; j++) if (ta[j][0]) al += count(ta[j][1])[0];
      chars.push(all); shown.push(sh); alone.push(al);
      if (al !== sh) split = true;
    }
    while (chars.length < this.rt.length) { chars.push(all); shown.push(sh); alone.push(al); } // past 8 MiB
    this.bufs = null;
    return { chars: chars, shown: shown, alone: split ? alone : null, all: all, shown_all: sh, fffd: bad };
  };

  function tick(ms) { return Math.round(ms * 10); } // 0.1 ms, the page clock's grain
  function deltas(xs) {
    var out = [], before = 0;
    for (var i = 0; i < xs.length; i++) { out.push(xs[i] - before); before = xs[i]; }
    return out;
  }
  function keep(xs, step) { // every step-th entry and the last: cumulative values stay exact
    if (step === 1) return xs.slice();
    var out = [];
    for (var i = step - 1; i < xs.length; i += step) out.push(xs[i]);
    if (xs.length && (xs.length % step)) out.push(xs[xs.length - 1]);
    return out;
  }
  function sums(xs, step) { // ... and what the merged entries add up to
    if (step === 1) return xs.slice();
    var out = [], s = 0;
    for (var i = 0; i < xs.length; i++) {
      s += xs[i];
      if ((i + 1) % step === 0 || i === xs.length - 1) { out.push(s); s = 0; }
    }
    return out;
  }

  Reply.prototype.doc = function (how, dec, rstep, fstep) {
    var t0 = this.t0, f = this.f, self = this, rel = function (t) { return tick(t - t0); };
    var layout = f.t.map(function (t, i) { return t === null ? f.raf[i] : t; });
    var reads = {
      t: deltas(keep(this.rt, rstep).map(rel)), bytes: sums(this.rb, rstep),
      chars: deltas(keep(dec.chars, rstep)), lost: this.lost, step: rstep,
    };
    if (dec.shown_all !== dec.all) reads.shown = deltas(keep(dec.shown, rstep));
    if (dec.alone) reads.alone = deltas(keep(dec.alone, rstep));
    var screen = null;
    if (this.el) {
      var idx = keep(layout.map(function (_, i) { return i; }), fstep);
      var lay = idx.map(function (i) { return rel(layout[i]); });
      screen = {
        t: deltas(lay),
        raf: idx.map(function (i, k) { return Math.max(0, lay[k] - rel(f.raf[i])); }),
        write: idx.map(function (i, k) { return lay[k] - rel(f.write[i]); }),
        chars: deltas(idx.map(function (i) { return f.chars[i]; })),
        tasks: idx.map(function (i) { return f.tasks[i]; }),
        removed: idx.map(function (i) { return f.removed[i]; }),
        lost: this.flost, step: fstep, slow: this.slow,
        paint: this.first && this.first.paint !== null ? Math.max(0, rel(this.first.paint)) : null,
        present: this.first && this.first.present !== null ? Math.max(0, rel(this.first.present)) : null,
        plain: this.el.getAttribute(ATTR) === "text",
      };
      if (f.fffd.some(function (x) { return x > 0; })) screen.fffd = idx.map(function (i) { return f.fffd[i]; });
    }
    var end = this.end || { t: now(), how: how };
    return {
      schema: "hopmeter.beacon/1", traceparent: this.tp, url: this.url,
      t0: Math.round(t0 * 1000) / 1000, status: this.status || 0,
      headers: this.th === undefined ? null : Math.max(0, rel(this.th)),
      end: Math.max(0, rel(end.t)), how: how, sent: Math.max(0, rel(now())), rt: this.timing(),
      reads: reads,
      stream: { bytes: this.bytes, chars: dec.all, shown: dec.shown_all, fffd: dec.fffd },
      screen: screen,
    };
  };
  Reply.prototype.send = function (how) {
    if (this.sent) return;
    this.sent = true;
    active.splice(active.indexOf(this), 1);
    if (!this.el) this.el = lastMarked(); // nothing changed: the bubble the reply should fill
    var dec = this.decode(), rstep = 1, fstep = 1, doc, body, size = 0;
    for (;;) { // halve the longer list until the beacon fits
      doc = this.doc(how, dec, rstep, fstep);
      var nr = doc.reads.bytes.length, nf = doc.screen ? doc.screen.t.length : 0;
      if (nr <= MAX_ENTRIES && nf <= MAX_ENTRIES) {
        body = JSON.stringify(doc);
        size = new TextEncoder().encode(body).length;
        if (size <= MAX_BODY || (nr < 2 && nf < 2)) break;
      }
      if (nr >= nf) rstep *= 2; else fstep *= 2;
    }
    if (cfg.text && this.el) { // opted in: the element's text, as much as fits
      var text = this.el.textContent || "", room = MAX_BODY - size - 16;
      while (text && new TextEncoder().encode(JSON.stringify(text)).length > room) text = text.slice(0, text.length >> 1);
      doc.text = text;
      body = JSON.stringify(doc);
    }
    sent.push(doc);
    if (sent.length > 16) sent.shift();
    // a string goes as text/plain: a CORS-safelisted type, no preflight
    if (!(navigator.sendBeacon && navigator.sendBeacon(cfg.endpoint, body))) {
      try {
        origFetch.call(W, cfg.endpoint, { method: "POST", body: body, keepalive: true, headers: { "content-type": "text/plain" } })
          .catch(function () {});
      } catch (e) { /* nothing to do: measuring must never break the page */ }
    }
  };

  // SSE (CR, LF or CRLF) or NDJSON, for counting: [isAnswer, text] per piece of visible text.
  function parser() {
    var buf = "", data = [], ndjson = null;
    function texts(o, out) {
      if (!o || typeof o !== "object") return;
      var c = o.choices;
      if (c && c.length) { // OpenAI chat completions
        for (var i = 0; i < c.length; i++) {
          var d = c[i].delta || {};
          if (typeof d.content === "string") out.push([1, d.content]);
          if (typeof d.reasoning_content === "string") out.push([0, d.reasoning_content]);
          if (typeof d.reasoning === "string") out.push([0, d.reasoning]);
          (d.tool_calls || []).forEach(function (t) {
            if (t && t.function && typeof t.function.arguments === "string") out.push([0, t.function.arguments]);
          });
        }
      } else if (o.type === "content_block_delta" && o.delta) { // Anthropic
        var a = o.delta;
        if (typeof a.text === "string") out.push([1, a.text]);
        if (typeof a.thinking === "string") out.push([0, a.thinking]);
        if (typeof a.partial_json === "string") out.push([0, a.partial_json]);
      } else if (typeof o.type === "string" && /\.delta$/.test(o.type) && typeof o.delta === "string") {
        out.push([o.type === "response.output_text.delta" ? 1 : 0, o.delta]); // OpenAI Responses
      } else if (o.message && typeof o.message.content === "string") { // Ollama chat
        out.push([1, o.message.content]);
        if (typeof o.message.thinking === "string") out.push([0, o.message.thinking]);
      } else if (typeof o.response === "string") out.push([1, o.response]); // Ollama generate
      else if (o.candidates) { // Gemini
        ((o.candidates[0] && o.candidates[0].content && o.candidates[0].content.parts) || [])
          .forEach(function (p) { if (typeof p.text === "string") out.push([p.thought ? 0 : 1, p.text]); });
      }
    }
    function json(s, out) { try { texts(JSON.parse(s), out); } catch (e) { /* not JSON: no text */ } }
    return function (s) {
      var out = [], m;
      buf += s;
      if (ndjson === null && /\S/.test(buf)) ndjson = buf.replace(/^\s+/, "")[0] === "{";
      while ((m = /\r\n|\r|\n/.exec(buf))) {
        if (m[0] === "\r" && m.index === buf.length - 1) break; // maybe half of a CRLF
        var line = buf.slice(0, m.index);
        buf = buf.slice(m.index + m[0].length);
        if (ndjson) { if (line) json(line, out); continue; }
        if (line === "") { if (data.length) json(data.join("\n"), out); data = []; }
        else if (line.slice(0, 5) === "data:") data.push(line.slice(5).replace(/^ /, ""));
      }
      return out;
    };
  }

  // The body, read through a pull stream with no queue of its own (highWaterMark 0): a chunk is
  // timed when the page's reader gets it, not when it reached the browser (tee() would time
  // arrival, and buffer without bound behind a slow reader). A new Response, so that text(),
  // json(), body readers and clone() all go through it.
  function wrapBody(res, reply) {
    if (!res.body) { reply.done("done"); return res; }
    var reader = res.body.getReader();
    var body = new ReadableStream({
      pull: function (ctl) {
        return reader.read().then(function (x) {
          if (x.done) { reply.done("done"); ctl.close(); return; }
          reply.chunk(x.value);
          ctl.enqueue(x.value);
        }, function (e) { reply.done("error"); ctl.error(e); });
      },
      cancel: function (why) { reply.done("cancel"); return reader.cancel(why); },
    }, { highWaterMark: 0 });
    var out = new Response(body, { status: res.status, statusText: res.statusText, headers: res.headers });
    ["url", "redirected", "type"].forEach(function (k) { Object.defineProperty(out, k, { value: res[k] }); });
    return out;
  }

  function traced(url, method) {
    if (cfg.match) return cfg.match.test(url.href);
    return url.origin === location.origin && method === "POST" && url.pathname.indexOf("/_hopmeter/") !== 0;
  }
  function tracedFetch(self, input, init, el) {
    var req = typeof Request !== "undefined" && input instanceof Request ? input : null;
    var method = ((init && init.method) || (req && req.method) || "GET").toUpperCase();
    var url = new URL(req ? req.url : String(input), location.href);
    var h = new Headers((init && init.headers) || (req ? req.headers : undefined));
    var tp = h.get("traceparent"); // the app's own trace, when it has one
    if (!tp) { tp = "00-" + hex(16) + "-" + hex(8) + "-01"; h.set("traceparent", tp); }
    var ts = h.get("tracestate"); // tells hopmeter a beacon will follow
    h.set("tracestate", ts ? "hopmeter=beacon," + ts : "hopmeter=beacon");
    var reply = new Reply(tp, url.pathname, method);
    reply.href = url.href;
    if (el) bind(reply, el);
    return origFetch.call(self, input, Object.assign({}, init, { headers: h })).then(function (res) {
      reply.th = now();
      reply.status = res.status;
      return wrapBody(res, reply);
    }, function (e) { reply.done("error"); throw e; });
  }
  W.fetch = function (input, init) {
    var req = typeof Request !== "undefined" && input instanceof Request ? input : null;
    var method = ((init && init.method) || (req && req.method) || "GET").toUpperCase();
    var url;
    try { url = new URL(req ? req.url : String(input), location.href); } catch (e) { url = null; }
    if (!url || !traced(url, method)) return origFetch.apply(this, arguments);
    return tracedFetch(this, input, init, null);
  };

  // -- the screen ------------------------------------------------------------------------------
  // A write to a marked element is stamped with the frame that paints it. While a reply is open
  // a rAF loop runs; a write between frames is painted by the next one (our rAF callback takes
  // it); a write inside a frame's rAF callbacks (an app that writes once per frame) is painted by
  // that frame: from our callback until the frame's layout, seen by a ResizeObserver on a 1-px
  // sentinel resized every frame, writes are stamped at once. The stamp is performance.now() in
  // that observer: after the frame's callbacks, style and layout, never before the write, within
  // a frame of it at p90 (measured), equal to Element Timing's paintTime within 0.1 ms.
  function bind(r, el) {
    r.el = el;
    if (!el.hasAttribute("elementtiming")) el.setAttribute("elementtiming", "hopmeter");
  }
  function owner(el) {
    for (var i = 0; i < active.length; i++) if (active[i].el === el) return active[i];
    for (i = 0; i < active.length; i++) {
      if (!active[i].el && !active[i].sent) { bind(active[i], el); return active[i]; }
    }
    return null;
  }
  function lastMarked() {
    var all = D.querySelectorAll("[" + ATTR + "]");
    return all.length ? all[all.length - 1] : null;
  }
  try {
    new PerformanceObserver(function (list) { // Element Timing: the first text painted (Chromium)
      list.getEntries().forEach(function (e) {
        for (var i = 0; i < active.length; i++) {
          var r = active[i];
          if (r.el === e.element && !r.first) {
            var pt = e.paintTime || e.renderTime, pr = e.presentationTime || e.renderTime;
            r.first = { paint: pt ? P.timeOrigin + pt : null, present: pr ? P.timeOrigin + pr : null };
          }
        }
      });
    }).observe({ type: "element", buffered: true });
  } catch (e) { /* no Element Timing here */ }
  var cur = null, lastFrame = 0, looping = false, marked = [], sentinel = null, flip = false;
  function stamp(r) {
    var p = r.pend, f = r.f, n = f.raf.length;
    r.pend = null;
    if (!r.el) return;
    var k = count(r.el.textContent || "");
    if (n && f.frame === cur.id) { // another write inside the frame already stamped
      f.tasks[n - 1] += p.tasks; f.removed[n - 1] += p.removed;
      f.chars[n - 1] = k[0]; f.fffd[n - 1] = k[1];
      return;
    }
    if (n >= KEEP) { r.flost++; return; }
    f.frame = cur.id;
    f.t.push(null); f.raf.push(cur.t); f.write.push(p.t);
    f.tasks.push(p.tasks); f.removed.push(p.removed); f.chars.push(k[0]); f.fffd.push(k[1]);
    marked.push([r, n]);
  }
  var mo = new MutationObserver(function (recs) {
    var t = now(), seen = [];
    for (var i = 0; i < recs.length; i++) {
      var n = recs[i].target, el = n.nodeType === 1 ? n : n.parentElement;
      el = el && el.closest("[" + ATTR + "]");
      if (!el) continue;
      var r = owner(el);
      if (!r) continue;
      var p = r.pend || (r.pend = { t: t, tasks: 0, removed: 0 });
      if (seen.indexOf(r) < 0) { p.tasks++; seen.push(r); }
      var rm = recs[i].removedNodes;
      for (var j = 0; j < rm.length; j++) p.removed += count(rm[j].textContent || "")[0];
      r.lastChange = t;
    }
    if (cur) for (i = 0; i < seen.length; i++) stamp(seen[i]);
    if (seen.length) loop();
  });
  mo.observe(D.documentElement, { subtree: true, childList: true, characterData: true });
  var ro = new ResizeObserver(function () { // after this frame's rAF callbacks, style and layout
    var t = now();
    for (var i = 0; i < marked.length; i++) marked[i][0].f.t[marked[i][1]] = t;
    marked = [];
    cur = null; // writes from here on are painted by the next frame
  });
  var frameId = 0;
  function frame(ts) {
    var open = false;
    cur = { id: ++frameId, t: now() };
    for (var i = 0; i < active.length; i++) {
      var r = active[i];
      if (!r.sent) open = true;
      if (lastFrame && ts - lastFrame > 25 && !r.end) r.slow++; // a dropped frame while streaming
      if (r.pend) stamp(r);
    }
    flip = !flip;
    sentinel.style.height = flip ? "1px" : "2px";
    lastFrame = ts;
    looping = open;
    if (open) requestAnimationFrame(frame);
    else cur = null;
  }
  function loop() {
    if (looping || !D.documentElement) return;
    if (!sentinel) {
      sentinel = D.createElement("div");
      sentinel.style.cssText = "position:fixed;left:0;top:0;width:1px;height:1px;visibility:hidden;pointer-events:none;contain:strict";
      D.documentElement.appendChild(sentinel); // outside any reply: the observer ignores it
      ro.observe(sentinel);
    }
    looping = true; lastFrame = 0;
    requestAnimationFrame(frame);
  }

  function flush(how) { // the page is going away or hidden: send what there is, marked so
    active.slice().forEach(function (r) { if (!r.end) r.done(how); r.send(how); });
  }
  W.addEventListener("pagehide", function () { flush("pagehide"); });
  D.addEventListener("visibilitychange", function () { if (D.visibilityState === "hidden") flush("hidden"); });

  var sent = [];
  W.hopmeter = {
    v: 1, cfg: cfg, sent: sent, count: count,
    // one call around a fetch that the automatic wrapping does not see (a library that kept its
    // own reference to fetch), optionally naming the element that shows its reply
    fetch: function (input, init, el) { return tracedFetch(W, input, init, el || null); },
    // a stream that is not a fetch (WebSocket, tests): r = hopmeter.reply(); r.chunk(u8);
    // r.done("done"). Its beacon names a trace no request carried: hopmeter answers 404.
    reply: function (url, el) {
      var r = new Reply("00-" + hex(16) + "-" + hex(8) + "-01", url || "", "manual");
      if (el) bind(r, el);
      return r;
    },
  };
})();
