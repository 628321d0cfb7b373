"""Micro-benchmark of counting an event's tokens: hopmeter's rank table against tiktoken's encoder.

    python bench/micro_tokens.py           # table on stdout, JSON in bench/results/
    python bench/micro_tokens.py --json    # the JSON on stdout too

Texts streamed as a reply streams them: prose and code (hopmeter's own docs), the reply texts
of the recorded provider streams (tests/corpus), and non-ASCII text (`MULTILINGUAL`, fourteen
languages and emoji, and the corpus' non-ASCII lines), cut into events of 1, 2 or 3 o200k_base
tokens (a word each without tiktoken). Each engine counts every event
through a fresh `TokenCounter` (its memo of short texts in front, as in the proxy): CPU time
per event (time.thread_time), median of rounds; and per call without that memo, on the texts
it missed (the table's own memo of pieces stays warm across rounds, as in a running proxy).
tiktoken is the reference (the test extra installs it; tests/harness/tiktoken_ref.py makes its
encoding offline); without it only the table is timed.
"""

from __future__ import annotations

import argparse
import importlib
import json
import platform
import random
import re
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "addons"))

from hopmeter.core.meter import FlowMeter
from hopmeter.core.tokens import TokenCounter
from hopmeter.core.vocab import Api, TokenSource
from hopmeter.proxy.addon.tokenizers import make_counter

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"


# Replies in other scripts than Latin's ASCII (the recorded streams have few): a few sentences
# each, written for this benchmark, with accents, case pairs, marks, digits and emoji.
MULTILINGUAL = """\
Der Proxy misst jede Antwort, ohne sie aufzuhalten: Größe, Wartezeit und Tokens pro Sekunde.
Le proxy mesure chaque réponse sans la retenir ; les écarts de plus d'une seconde sont signalés.
Każda odpowiedź jest mierzona w locie, a przerwy dłuższe niż próg są zgłaszane jako zastój.
Odpověď se měří průběžně; čas do prvního tokenu je uložen v záznamu toku.
Yanıt akarken ölçülür; ilk belirtece kadar geçen süre kaydedilir ve ağ gecikmesi ayrıca tutulur.
Прокси измеряет каждый ответ на лету: задержку первого токена, паузы и скорость потока.
Ґрунтовні вимірювання не змінюють жодного байта відповіді, яку отримує клієнт.
Ο διακομιστής μετρά κάθε απάντηση χωρίς να την καθυστερεί· οι παύσεις καταγράφονται.
Proxy đo từng phản hồi mà không làm chậm nó; thời gian đến token đầu tiên được ghi lại.
代理在不延迟响应的情况下测量每个回复：首个令牌的时间、停顿以及每秒令牌数。
プロキシは応答を遅らせずに計測します。最初のトークンまでの時間と停止を記録します。
프록시는 응답을 지연시키지 않고 측정합니다. 첫 토큰까지의 시간과 멈춤을 기록합니다.
يقيس الوكيل كل استجابة دون تأخيرها، ويسجل زمن أول رمز والتوقفات.
प्रॉक्सी हर उत्तर को बिना रोके मापता है: पहले टोकन का समय और ठहराव दर्ज होते हैं।
Done ✅ — 3 streams, 1.2 s to first token 🚀, 42 tok/s 👍🏽; ½ of them stalled ⚠️.
"""


def sources() -> dict[str, str]:
    """Prose and code, the reply text the proxy keeps of each recorded stream, and the lines of
    those replies that are not pure ASCII (other scripts, accents, emoji: the text the
    pre-tokenizer's Unicode classes split)."""
    docs = "".join(p.read_text() for p in sorted((ROOT / "docs").glob("*.md")))
    replies = []
    for path in sorted((ROOT / "tests" / "corpus").rglob("*")):
        if path.suffix in {".sse", ".ndjson"}:
            ndjson = path.suffix == ".ndjson"
            meter = FlowMeter(  # the API sniffed from the payloads, as for an unknown upstream
                api=Api.NDJSON if ndjson else Api.SSE,
                content_type="application/x-ndjson" if ndjson else "text/event-stream",
                content_encoding=None,
            )
            meter.feed(path.read_bytes(), 0.0)
            meter.close(1.0)
            replies.append(meter.text())
    corpus = "".join(replies)
    non_ascii = "".join(line for line in corpus.splitlines(keepends=True) if not line.isascii())
    return {"docs": docs, "corpus": corpus, "non_ascii": MULTILINGUAL + non_ascii}


def events_by_tokens(text: str, encode: Any, decode_bytes: Any) -> list[str]:
    """`text` cut into events of 1, 2 or 3 tokens (mostly 1), as a reply streams; a character
    whose bytes two tokens share goes whole into one event, as a stream sends it."""
    rnd = random.Random(1)
    ids = encode(text)
    out, i = [], 0
    while i < len(ids):
        k = rnd.choice((1, 1, 1, 2, 3))
        while True:
            try:
                out.append(decode_bytes(ids[i : i + k]).decode())
                break
            except UnicodeDecodeError:
                k += 1
        i += k
    return out


def events_by_words(text: str) -> list[str]:
    """Without tiktoken: an event per word and the space before it."""
    return re.findall(r"\s*\S+", text)


def memo_misses(texts: list[str]) -> list[str]:
    """The texts a fresh TokenCounter's memo sends to its tokenizer, in order."""
    missed: list[str] = []

    def record(text: str) -> int:
        missed.append(text)
        return 0

    probe = TokenCounter(name="probe", source=TokenSource.TOKENIZER, exact=True, count=record)
    for text in texts:
        probe.count(text)
    return missed


def per_event_us(count: Callable[[str], int], texts: list[str], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        counter = TokenCounter(name="x", source=TokenSource.TOKENIZER, exact=True, count=count)
        t0 = time.thread_time()
        for text in texts:
            counter.count(text)
        times.append((time.thread_time() - t0) / len(texts) * 1e6)
    return round(statistics.median(times), 3)


def per_call_us(count: Callable[[str], int], texts: list[str], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        t0 = time.thread_time()
        for text in texts:
            count(text)
        times.append((time.thread_time() - t0) / len(texts) * 1e6)
    return round(statistics.median(times), 3)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--json", action="store_true")
    p.add_argument("--note", default="", help="what was measured, for the results file")
    args = p.parse_args()
    table = make_counter("gpt-4o")._count
    engines: dict[str, Callable[[str], int]] = {"table": table}
    try:
        import tiktoken  # noqa: PLC0415 - the reference, from the test extra
    except ImportError:
        tiktoken_found = False
    else:
        tiktoken_found = True
    if tiktoken_found:
        # tiktoken's own encoding from the vocabulary hopmeter ships, without a network
        sys.path.insert(0, str(ROOT))
        reference = importlib.import_module("tests.harness.tiktoken_ref")
        enc: tiktoken.Encoding = reference.encoding("o200k_base")
        engines["tiktoken"] = lambda text: len(enc.encode_ordinary(text))

        def cut(text: str) -> list[str]:
            return events_by_tokens(text, enc.encode_ordinary, enc.decode_bytes)
    else:
        cut = events_by_words
    out: dict[str, Any] = {
        "schema": "hopmeter.bench/1",
        "kind": "micro_tokens",
        "started_utc": datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ"),
        "python": platform.python_version(),
        "rounds": args.rounds,
        "note": args.note,
        "sets": {},
    }
    print(
        f"{'set':8} {'events':>7} {'missed':>7}  "
        + "  ".join(f"{name + ' µs/event':>18} {name + ' µs/call':>17}" for name in engines)
    )
    for name, text in sources().items():
        texts = cut(text)
        missed = memo_misses(texts)
        row: dict[str, Any] = {"events": len(texts), "memo_misses": len(missed)}
        for engine, count in engines.items():
            row[f"{engine}_us_per_event"] = per_event_us(count, texts, args.rounds)
            row[f"{engine}_us_per_call"] = per_call_us(count, missed, args.rounds)
        out["sets"][name] = row
        print(
            f"{name:8} {row['events']:>7} {row['memo_misses']:>7}  "
            + "  ".join(
                f"{row[f'{e}_us_per_event']:>18} {row[f'{e}_us_per_call']:>17}" for e in engines
            )
        )
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"micro-tokens-{out['started_utc']}.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    if args.json:
        print(json.dumps(out, indent=1))
    print(f"written {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
