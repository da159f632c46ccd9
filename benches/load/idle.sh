#!/usr/bin/env bash
# Memory of idle client connections (issue 29): CONNECTIONS keep-alive clients each send
# REQUESTS requests through the proxy to an nginx origin, one after the other, read the
# answers and then stay open, doing nothing. Reports the proxy's RSS (anonymous memory: the connections' own) before
# and after, and the growth per connection, for each binary given.
#
# Usage: benches/load/idle.sh [BINARY ...]   (default: target/dist/proxima, built first)
# Environment (defaults in brackets):
#   CONNECTIONS [5000]  REQUESTS [1] (per connection, before it goes idle)  ROUNDS [1] (each binary measured ROUNDS times, interleaved)
#   BODY_BYTES [0] (0: GET; more: each request is a POST with a body this long, as a device sending a reading)
#   PROTOCOL [h1] (h1: HTTP/1.1 keep-alive; h2: HTTP/2 over cleartext with prior knowledge, one stream per request)
#   BASE_PORT [18280] (origin port; proxy and admin use the next two)
#   RESULTS_DIR [benches/load/results]
set -euo pipefail

CONNECTIONS=${CONNECTIONS:-5000}
REQUESTS=${REQUESTS:-1}
BODY_BYTES=${BODY_BYTES:-0}
PROTOCOL=${PROTOCOL:-h1}
ROUNDS=${ROUNDS:-1}
BASE_PORT=${BASE_PORT:-18280}
ORIGIN_PORT=$BASE_PORT
PROXY_PORT=$((BASE_PORT + 1))
ADMIN_PORT=$((BASE_PORT + 2))

NAME=idle
# shellcheck source=benches/load/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
[[ $PROTOCOL == h1 || $PROTOCOL == h2 ]] || die "PROTOCOL must be h1 or h2, not $PROTOCOL"

for tool in nginx curl python3; do
    command -v "$tool" >/dev/null || die "$tool is missing (benches/load/run.sh installs nginx)"
done
# Each connection is a file in the client and one in the proxy (separate processes).
ulimit -n $((CONNECTIONS + 1000)) 2>/dev/null ||
    die "cannot raise the open-file limit to $((CONNECTIONS + 1000)) (hard limit $(ulimit -Hn))"

BINARIES=("$@")
if [[ ${#BINARIES[@]} -eq 0 ]]; then
    log "building proxima (profile dist: fat LTO, a few minutes)"
    (cd "$ROOT" && cargo build --profile dist -p proxima) >"$WORK/build.log" 2>&1 ||
        { cat "$WORK/build.log" >&2; die "build failed"; }
    BINARIES=("$ROOT/target/dist/proxima")
fi

cat >"$WORK/origin.conf" <<EOF
worker_processes 1; daemon off; pid $WORK/origin.pid;
events { worker_connections 1024; }
http { access_log off; server {
  listen 127.0.0.1:$ORIGIN_PORT;
  location / { return 200 "hello from origin\n"; } } }
EOF
cat >"$WORK/discovery.yaml" <<EOF
services:
  - name: api
    namespace: default
    settings: { latency-slo: 100ms }
    endpoints:
      - { id: api-0, address: 127.0.0.1:$ORIGIN_PORT }
EOF
nginx -e "$WORK/origin-error.log" -p "$WORK" -c "$WORK/origin.conf" &
PIDS+=($!)

# Opens the connections, one request each, waits for every answer, holds them idle for
# a few seconds and prints the proxy's RssAnon (KiB) before and after.
cat >"$WORK/clients.py" <<'EOF'
import asyncio, sys, time

count, port, pid, requests = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
body, protocol = int(sys.argv[5]), sys.argv[6]
if body:
    REQUEST = (b"POST / HTTP/1.1\r\nhost: api\r\nx-service: api\r\ncontent-length: %d\r\n\r\n" % body) + b"x" * body
else:
    REQUEST = b"GET / HTTP/1.1\r\nhost: api\r\nx-service: api\r\n\r\n"

# HTTP/2 by hand (RFC 9113), enough for one stream at a time: the preface and an empty
# SETTINGS, then per request a HEADERS frame (HPACK: indexed or literal fields without
# indexing, no Huffman, RFC 7541) and, for a POST, one DATA frame.
def frame(kind, flags, stream, payload=b""):
    return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big") + payload

def literal(name, value):
    return b"\x00" + bytes([len(name)]) + name + bytes([len(value)]) + value

H2_FIELDS = (b"\x83" if body else b"\x82") + b"\x86\x84" + b"\x01\x03api" + literal(b"x-service", b"api")
if body:
    H2_FIELDS += literal(b"content-length", str(body).encode())

def h2_request(stream):
    if not body:
        return frame(1, 0x5, stream, H2_FIELDS)  # END_HEADERS | END_STREAM
    return frame(1, 0x4, stream, H2_FIELDS) + frame(0, 0x1, stream, b"x" * body)

async def h2_answer(reader, writer, stream):
    while True:
        head = await reader.readexactly(9)
        length, kind, flags = int.from_bytes(head[:3], "big"), head[3], head[4]
        sid = int.from_bytes(head[5:9], "big") & 0x7FFFFFFF
        payload = await reader.readexactly(length)
        if kind == 4 and not flags & 0x1:
            writer.write(frame(4, 0x1, 0))  # SETTINGS ACK
        elif kind == 7:
            raise RuntimeError(f"GOAWAY {payload[4:8].hex()}")
        elif kind in (0, 1) and sid == stream and flags & 0x1:
            return

def rss_anon():
    with open(f"/proc/{pid}/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("RssAnon:"))

async def one(held):
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    if protocol == "h2":
        writer.write(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + frame(4, 0, 0))
        for i in range(requests):
            writer.write(h2_request(2 * i + 1))
            await h2_answer(reader, writer, 2 * i + 1)
        held.append(writer)
        return
    for _ in range(requests):
        writer.write(REQUEST)
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(int(l.split(b":")[1]) for l in head.split(b"\r\n")
                      if l.lower().startswith(b"content-length:"))
        await reader.readexactly(length)
    held.append(writer)

async def main():
    held, room = [], asyncio.Semaphore(200)
    async def guarded():
        async with room:
            await one(held)
    await asyncio.sleep(1)
    before = rss_anon()
    tasks = [asyncio.create_task(guarded()) for _ in range(count)]
    for done, task in enumerate(asyncio.as_completed(tasks), 1):
        await task
        if done % 1000 == 0:
            print(f"  {done}/{count} connections answered and idle", file=sys.stderr, flush=True)
    await asyncio.sleep(3)
    after = rss_anon()
    print(before, after, len(held))
    for writer in held:
        writer.close()

asyncio.run(main())
EOF

RESULT=$RESULTS_DIR/${STAMP}-idle.md
mkdir -p "$RESULTS_DIR"
{
    echo "# Idle client connections, $STAMP"
    echo
    echo "$CONNECTIONS keep-alive $([[ $PROTOCOL == h2 ]] && echo "HTTP/2 (h2c)" || echo HTTP/1.1) clients, $REQUESTS request(s) each ($([[ $BODY_BYTES -gt 0 ]] && echo "POST, $BODY_BYTES-byte body" || echo GET)) then idle; the proxy's RssAnon before and 3 s after the last answer. Load average at start: $(cut -d' ' -f1-3 /proc/loadavg)."
    echo
    echo "| binary | round | RssAnon before (KiB) | after (KiB) | per connection (bytes) |"
    echo "|---|---:|---:|---:|---:|"
} >"$RESULT"
for ((round = 1; round <= ROUNDS; round++)); do
    for bin in "${BINARIES[@]}"; do
        # A fresh copy of the file, as scale.sh does (page-cache folios change file RSS).
        cp "$bin" "$WORK/proxima"
        TOKIO_WORKER_THREADS=1 "$WORK/proxima" run --listen "127.0.0.1:$PROXY_PORT" --admin "127.0.0.1:$ADMIN_PORT" \
            --discovery "file:$WORK/discovery.yaml" --log-level warn \
            --max-client-connections $((CONNECTIONS + 100)) >"$WORK/proxima.log" 2>&1 &
        pid=$!
        PIDS+=("$pid")
        for _ in $(seq 100); do
            [[ $(curl -s -o /dev/null -w '%{http_code}' -H 'x-service: api' "http://127.0.0.1:$PROXY_PORT/") == 200 ]] && break
            sleep 0.2
        done
        log "round $round, $bin: opening $CONNECTIONS connections"
        read -r before after held < <(python3 "$WORK/clients.py" "$CONNECTIONS" "$PROXY_PORT" "$pid" "$REQUESTS" "$BODY_BYTES" "$PROTOCOL")
        [[ $held == "$CONNECTIONS" ]] || die "only $held of $CONNECTIONS connections answered"
        per=$(((after - before) * 1024 / CONNECTIONS))
        printf '| %s | %d | %d | %d | %d |\n' "$bin" "$round" "$before" "$after" "$per" >>"$RESULT"
        log "round $round, $bin: RssAnon $before -> $after KiB, $per bytes per idle connection"
        kill "$pid"
        wait "$pid" 2>/dev/null || true
    done
done
echo >>"$RESULT"
echo "Load average at the end: $(cut -d' ' -f1-3 /proc/loadavg). Command: \`CONNECTIONS=$CONNECTIONS REQUESTS=$REQUESTS BODY_BYTES=$BODY_BYTES PROTOCOL=$PROTOCOL ROUNDS=$ROUNDS benches/load/idle.sh $*\`." >>"$RESULT"
cat "$RESULT"
