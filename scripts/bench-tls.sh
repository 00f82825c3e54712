#!/usr/bin/env bash
# Large values over TLS against plain TCP, in one run: kvtier and
# redis-server (Debian's is built with TLS), each serving a plain port and a
# TLS port (client certificates required), measured by redis-benchmark with
# the same commands, plain and TLS alternated round by round.
#   SIZES="65536 1048576"   value sizes of GET (and of MGETPREFIX's blocks)
#   CLIENTS="1 50"           connections
#   REPS=3                   rounds
#   N=2000                   requests per cell (fewer for 1 MiB values)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$(dirname "$0")/.."
for tool in redis-server redis-benchmark openssl; do
  command -v "$tool" >/dev/null || { echo "missing $tool"; exit 1; }
done
bench_setup tls
SIZES=${SIZES:-"65536 1048576"}
CLIENTS=${CLIENTS:-"1 50"}
REPS=${REPS:-3}
N=${N:-2000}

# A CA and the server and client certificates it signed.
scripts/test-certs.sh "$WORK"
TLS_FILES=(--tls-cert-file "$WORK/server.crt" --tls-key-file "$WORK/server.key" --tls-ca-cert-file "$WORK/ca.crt")
CLIENT_TLS=(--tls --cacert "$WORK/ca.crt" --cert "$WORK/client.crt" --key "$WORK/client.key")

KV=$(free_port); KV_TLS=$(free_port); RD=$(free_port); RD_TLS=$(free_port)
$BIN --port "$KV" --tls-port "$KV_TLS" "${TLS_FILES[@]}" --metrics-addr none >"$WORK/kv.log" 2>&1 & PIDS+=($!)
redis-server --port "$RD" --tls-port "$RD_TLS" "${TLS_FILES[@]}" --save '' --appendonly no \
  >"$WORK/redis.log" 2>&1 & PIDS+=($!)
wait_up "$KV"; wait_up "$RD"

# Values: one key per size for GET, 16 blocks per size for MGETPREFIX/MGET.
for size in $SIZES; do
  head -c "$size" /dev/urandom >"$WORK/v$size"
  for port in $KV $RD; do
    redis-cli -p "$port" -x SET "v$size" <"$WORK/v$size" >/dev/null
    for i in $(seq 16); do redis-cli -p "$port" -x SET "b$size:$i" <"$WORK/v$size" >/dev/null; done
  done
done

# rps SERVER_PORT TLS(yes|no) CLIENTS REQUESTS COMMAND...: requests/s.
rps() {
  local port=$1 tls=$2 clients=$3 n=$4; shift 4
  local extra=()
  [ "$tls" = yes ] && extra=("${CLIENT_TLS[@]}")
  redis-benchmark -p "$port" "${extra[@]}" -c "$clients" -n "$n" --csv "$@" 2>/dev/null |
    tail -1 | cut -d, -f2 | tr -d '"'
}

printf '%-10s %-22s %8s %12s %12s %10s\n' server cell clients plain_GB/s tls_GB/s tls/plain
results=()
for size in $SIZES; do
  n=$N; [ "$size" -ge 1048576 ] && n=$((N / 4))
  keys=""; for i in $(seq 16); do keys="$keys b$size:$i"; done
  for clients in $CLIENTS; do
    for server in kvtier redis; do
      if [ $server = kvtier ]; then plain=$KV; tls=$KV_TLS; multi="MGETPREFIX 16$keys"; else plain=$RD; tls=$RD_TLS; multi="MGET$keys"; fi
      for cell in get multi; do
        if [ $cell = get ]; then cmd=(GET "v$size"); bytes=$size; m=$n; else read -ra cmd <<<"$multi"; bytes=$((16 * size)); m=$((n / 4)); fi
        p_sum=0; t_sum=0
        for _ in $(seq "$REPS"); do
          p=$(rps "$plain" no "$clients" "$m" "${cmd[@]}")
          t=$(rps "$tls" yes "$clients" "$m" "${cmd[@]}")
          p_sum=$(python3 -c "print($p_sum + $p)"); t_sum=$(python3 -c "print($t_sum + $t)")
        done
        line=$(python3 -c "
p, t, b, r = $p_sum / $REPS, $t_sum / $REPS, $bytes, $REPS
print('%-10s %-22s %8s %12.2f %12.2f %10.2f' % ('$server', '${cmd[0]} ${size}B' + (' x16' if '$cell' == 'multi' else ''), '$clients', p * b / 1e9, t * b / 1e9, t / p))")
        echo "$line"; results+=("$line")
      done
    done
  done
done
