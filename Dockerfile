# syntax=docker/dockerfile:1
# hopmeter: a measuring reverse proxy for LLM token streams.
#   docker build -t hopmeter .
#   docker run --rm -p 127.0.0.1:8080:8080 -p 127.0.0.1:9464:9464 hopmeter run http://host.docker.internal:8000
# Configured by environment: every `hopmeter run` flag has its HOPMETER_* variable (README), e.g.
#   docker run --rm -p 127.0.0.1:8080:8080 -p 127.0.0.1:9464:9464 \
#     -e HOPMETER_UPSTREAM=http://host.docker.internal:8000 -e HOPMETER_HOP=edge hopmeter
# `docker stop` sends SIGTERM: hopmeter drains (HOPMETER_DRAIN_TIMEOUT, 20 s); give it
# `docker stop -t 30` (compose: stop_grace_period: 30s), the default 10 s cuts the drain short.

# --- builder: hopmeter and every dependency as wheels, at the versions of the lock -----------
FROM python:3.12-slim AS builder
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY requirements/run.txt ./requirements/
COPY addons ./addons
# requirements/run.txt (scripts/lock): every package pinned, every file checked against its
# sha256; it holds the otel extra (--otel-endpoint, `hopmeter join --serve`) and the locked
# setuptools that builds hopmeter's own wheel, so nothing unpinned is fetched
RUN pip download --require-hashes --no-deps --only-binary=:all: --dest /wheels -r requirements/run.txt \
 && pip install --no-index --find-links /wheels --require-hashes --no-deps -r requirements/run.txt \
 && pip wheel --no-index --no-deps --no-build-isolation --wheel-dir /wheels .

# --- final: the wheels installed into a clean image, run as an unprivileged user -----------
FROM python:3.12-slim
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HOPMETER_HEALTHCHECK_URL=http://127.0.0.1:9464/healthz \
    HOPMETER_LISTEN=0.0.0.0:8080 \
    HOPMETER_METRICS=0.0.0.0:9464
RUN groupadd --system --gid 10001 hopmeter \
 && useradd --system --uid 10001 --gid hopmeter --create-home --home-dir /home/hopmeter hopmeter
COPY --from=builder /wheels /wheels
COPY --from=builder /src/requirements/run.txt /tmp/run.txt
RUN pip install --no-cache-dir --no-index --find-links /wheels --require-hashes --no-deps -r /tmp/run.txt \
 && pip install --no-cache-dir --no-index --no-deps /wheels/hopmeter-*.whl \
 && rm -rf /wheels /tmp/run.txt
USER 10001:10001
WORKDIR /home/hopmeter
# The tokenizers' rank tables (~6 MiB), built once here into ~/.cache/hopmeter instead of at
# each container's first start: every container of this image maps the same file, and the host
# keeps one copy of its pages for all of them.
RUN python -c "from hopmeter.proxy.addon.tokenizers import make_counter; make_counter('gpt-4o'); make_counter('gpt-4')"
# 8080: the proxy (HOPMETER_LISTEN); 9464: /metrics, /healthz and /readyz (HOPMETER_METRICS)
EXPOSE 8080 9464
# The metrics endpoint answers /healthz (liveness: the upstream being down does not make the
# container unhealthy); with --metrics elsewhere or off, set HOPMETER_HEALTHCHECK_URL or run
# with --no-healthcheck.
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
  CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen(os.environ['HOPMETER_HEALTHCHECK_URL'], timeout=2)"]
ENTRYPOINT ["hopmeter"]
CMD ["run"]
