# Shared by the load scripts (sourced): a work directory that goes with the script, and
# the configs in it (the origin nginx, nginx and HAProxy as reverse proxies, Proxima's
# discovery file).

# `work_dir NAME`: a fresh $WORK, and $PIDS for the processes started there (append each
# one's pid); when the script exits, the processes are stopped and $WORK removed.
work_dir() {
    WORK=$(mktemp -d "/tmp/proxima-$1.XXXXXX")
    PIDS=()
    trap stop_work EXIT
}

stop_work() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$WORK"
}

# Reads: WORK WORKERS ORIGIN_WORKERS ORIGIN_PORT NGINX_PORT HAPROXY_PORT CONNECTIONS,
# and PIN_CPUS (yes: each proxy's workers one per CPU, nginx's `worker_cpu_affinity
# auto`, HAProxy's `cpu-map`; the origin is never pinned).
write_configs() {
local nginx_pin="" haproxy_pin=""
if [[ ${PIN_CPUS:-no} == yes ]]; then
    ((WORKERS <= $(nproc))) || { echo "PIN_CPUS=yes needs WORKERS <= $(nproc)" >&2; return 1; }
    nginx_pin="worker_cpu_affinity auto;"
    haproxy_pin="    cpu-map auto:1/1-$WORKERS 0-$((WORKERS - 1))"
fi
mkdir -p "$WORK/tmp"
nginx_common() { # $1 = name
    cat <<EOF
daemon off;
pid $WORK/$1.pid;
error_log $WORK/$1-error.log warn;
events { worker_connections 8192; multi_accept on; }
EOF
}
nginx_http_common() {
    cat <<EOF
    access_log off;
    keepalive_timeout 120s;
    keepalive_requests 10000000;
    client_body_temp_path $WORK/tmp/body;
    proxy_temp_path $WORK/tmp/proxy;
    fastcgi_temp_path $WORK/tmp/fastcgi;
    uwsgi_temp_path $WORK/tmp/uwsgi;
    scgi_temp_path $WORK/tmp/scgi;
EOF
}

{
    echo "worker_processes $ORIGIN_WORKERS;"
    nginx_common origin
    echo "http {"
    nginx_http_common
    cat <<EOF
    server {
        listen 127.0.0.1:$ORIGIN_PORT reuseport;
        location / { default_type text/plain; return 200 "hello from the origin\n"; }
    }
}
EOF
} >"$WORK/origin.conf"

{
    echo "worker_processes $WORKERS;"
    echo "$nginx_pin"
    nginx_common nginx
    echo "http {"
    nginx_http_common
    cat <<EOF
    upstream origin {
        server 127.0.0.1:$ORIGIN_PORT;
        keepalive 256;
        keepalive_requests 10000000;
        keepalive_timeout 120s;
    }
    server {
        listen 127.0.0.1:$NGINX_PORT reuseport;
        location / {
            proxy_pass http://origin;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }
    }
}
EOF
} >"$WORK/nginx.conf"

cat >"$WORK/haproxy.cfg" <<EOF
global
    nbthread $WORKERS
$haproxy_pin
    maxconn $((CONNECTIONS * 2 + 1024))
    pidfile $WORK/haproxy.pid
defaults
    mode http
    option http-keep-alive
    http-reuse always
    timeout connect 5s
    timeout client 120s
    timeout server 120s
frontend bench
    bind 127.0.0.1:$HAPROXY_PORT
    default_backend origin
backend origin
    server origin 127.0.0.1:$ORIGIN_PORT
EOF

cat >"$WORK/discovery.yaml" <<EOF
services:
  - name: bench
    namespace: default
    settings: { latency-slo: 100ms, strategy: qos-pool }
    endpoints:
      - { id: origin, address: 127.0.0.1:$ORIGIN_PORT }
EOF

}
