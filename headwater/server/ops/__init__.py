"""What operators see: `http` (a minimal HTTP/1.1 listener) and `operator_port` (its routes),
`metrics` (Prometheus, made at scrape time), `status` and `status_page` (readiness, recent
samples, the HTML page). Imports `net`, `catalog`, `security` and `topics`."""
