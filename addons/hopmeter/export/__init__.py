"""Where finished flows go: Prometheus, OpenTelemetry, record files, the console. No mitmproxy."""
