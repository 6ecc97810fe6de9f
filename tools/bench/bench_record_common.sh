# Shared by tools/bench/bench_record.sh and tools/bench/bench_record_h2.sh (sourced, not run): the build, the
# scratch directory and its cleanup, and the two processes every round talks to: the scripted SSE
# upstream (bench_record upstream) and `retrace record` in front of it. Uses the caller's OUT, TGT,
# UP, REC, ADM, TTFT_MS, ITL_MS, TOKENS; sets WORK, PIDS, B and REC_PID.
#
# PIN=1 splits the 2 cores: the load generator and the upstream run on CPU 0 ($GEN), every proxy on
# CPU 1 ($PRX; nginx then gets one worker; the floor forwarder tools/bench/fwd_floor.rs too). Direct and proxied rounds then leave the generator
# side the same core, so "added" latency is the proxy's own, not its share of a saturated machine.
if [ "${PIN:-0}" = 1 ]; then
  command -v taskset >/dev/null || { echo "PIN=1 needs taskset (util-linux)" >&2; exit 1; }
  GEN="taskset -c 0"; PRX="taskset -c 1"; NGX_WORKERS=1
else
  GEN=""; PRX=""; NGX_WORKERS=auto
fi

bench_setup() {
  cargo build --release --quiet --bin retrace --example bench_record --example fwd_floor
  mkdir -p "$OUT"
  WORK=$(mktemp -d)
  PIDS=()
  trap bench_cleanup EXIT
}

bench_cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}

# start_recorder NAME PORT ADMIN: this build's recorder with the bench's flags, in front of the
# upstream, recording to $WORK/traces[-NAME]; its pid is in $! and in PIDS.
start_recorder() {
  local dir=traces${1:+-$1} log=retrace${1:+-$1}.log
  RUST_LOG=warn $PRX "$TGT/retrace" record --listen 127.0.0.1:$2 --upstream http://127.0.0.1:$UP \
    --out "$WORK/$dir" --admin 127.0.0.1:$3 2>"$WORK/$log" &
  PIDS+=($!)
}

start_upstream_and_recorder() {
  B="$TGT/examples/bench_record"
  $GEN "$B" upstream --listen 127.0.0.1:$UP --ttft-ms "$TTFT_MS" --itl-ms "$ITL_MS" --tokens "$TOKENS" --lifetime-s 3600 &
  PIDS+=($!)
  start_recorder "" $REC $ADM
  REC_PID=$!
}

# nginx as the peer reverse proxy (buffering off both ways, HTTP/1.1 keep-alive pool upstream),
# the same in every record benchmark but for its process model, connection limits and listener:
# write_nginx_conf PROCESS_LINES EVENTS UPSTREAM_KEEPALIVE LISTEN [HTTP_EXTRA]
# writes $WORK/nginx.conf (prefix $WORK/nginx) for the upstream on $UP.
write_nginx_conf() {
  mkdir -p "$WORK/nginx"
  cat >"$WORK/nginx.conf" <<EOF
$1
daemon off;
pid $WORK/nginx.pid;
error_log $WORK/nginx-error.log warn;
events { $2 }
http {
  access_log off;
  client_body_temp_path $WORK/nginx/body;
  proxy_temp_path $WORK/nginx/proxy;
  fastcgi_temp_path $WORK/nginx/fcgi;
  uwsgi_temp_path $WORK/nginx/uwsgi;
  scgi_temp_path $WORK/nginx/scgi;
  upstream llm { server 127.0.0.1:$UP; keepalive $3; }
  ${5:-}
  server {
    listen $4;
    keepalive_requests 1000000;
    location / {
      proxy_pass http://llm;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_request_buffering off;
      proxy_read_timeout 600s;
    }
  }
}
EOF
}
