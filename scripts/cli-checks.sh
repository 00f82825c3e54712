#!/usr/bin/env bash
# Drives kvtier with the real redis-cli and redis-benchmark: basic commands,
# a --pipe mass insert, --scan, RESP3 mode (-3) and a short benchmark run.
# Starts its own kvtier (KVTIER_BIN, default target/debug/kvtier-server) on an
# ephemeral port and stops it on exit.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
BIN=${KVTIER_BIN:-target/debug/kvtier-server}
WORK=$(mktemp -d)
PID=
PASSED=0
FAILED=0

cleanup() {
    if [[ -n $PID ]] && kill -0 "$PID" 2>/dev/null; then
        kill -TERM "$PID" 2>/dev/null || true
        for _ in $(seq 50); do
            kill -0 "$PID" 2>/dev/null || break
            sleep 0.2
        done
        kill -KILL "$PID" 2>/dev/null || true
        wait "$PID" 2>/dev/null || true
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

ok() {
    PASSED=$((PASSED + 1))
    echo "PASS  $1"
}

bad() {
    FAILED=$((FAILED + 1))
    echo "FAIL  $1"
}

# expect DESCRIPTION WANT GOT
expect() {
    if [[ $3 == "$2" ]]; then
        ok "$1"
    else
        bad "$1: want [$2] got [$3]"
    fi
}

# contains DESCRIPTION NEEDLE HAYSTACK
contains() {
    if [[ $3 == *"$2"* ]]; then
        ok "$1"
    else
        bad "$1: [$2] not in [$3]"
    fi
}

[[ -x $BIN ]] || {
    echo "kvtier binary $BIN not found (cargo build -p kvtier-server)" >&2
    exit 1
}

"$BIN" --port 0 --metrics-addr none --threads 4 >"$WORK/stdout" 2>"$WORK/stderr" &
PID=$!
PORT=
for _ in $(seq 300); do
    if [[ -s $WORK/stdout ]]; then
        PORT=$(sed -n 's/^kvtier listening on [0-9.]*:\([0-9]*\)$/\1/p' "$WORK/stdout" | head -1)
        [[ -n $PORT ]] && break
    fi
    kill -0 "$PID" 2>/dev/null || break
    sleep 0.1
done
if [[ -z $PORT ]]; then
    echo "kvtier did not start:" >&2
    cat "$WORK/stdout" "$WORK/stderr" >&2
    exit 1
fi
echo "kvtier pid $PID on port $PORT"

cli() {
    timeout 60 redis-cli -h 127.0.0.1 -p "$PORT" "$@"
}

# Basic commands (output is not a tty, so redis-cli prints raw replies).
expect "PING" "PONG" "$(cli PING)"
expect "FLUSHALL" "OK" "$(cli FLUSHALL)"
expect "SET" "OK" "$(cli SET greeting 'hello world')"
expect "GET" "hello world" "$(cli GET greeting)"
expect "APPEND" "12" "$(cli APPEND greeting '!')"
expect "INCRBY" "42" "$(cli INCRBY counter 42)"
expect "MGET (nil is an empty line)" $'hello world!\n42\n\nend' "$(cli MGET greeting counter missing; echo end)"
expect "SET EX + TTL" "100" "$(cli SET temp v EX 100 >/dev/null; cli TTL temp)"
expect "--no-raw GET missing" "(nil)" "$(cli --no-raw GET missing)"
expect "--no-raw INCR" "(integer) 43" "$(cli --no-raw INCR counter)"
contains "error reply" "ERR wrong number of arguments for 'get' command" "$(cli GET 2>&1)"
if cli -e GET >/dev/null 2>&1; then
    bad "redis-cli -e exits non-zero on an error reply"
else
    ok "redis-cli -e exits non-zero on an error reply"
fi
expect "DEL" "3" "$(cli DEL greeting counter temp)"
expect "DBSIZE after DEL" "0" "$(cli DBSIZE)"
contains "INFO server" "redis_version:7.2.4" "$(cli INFO server)"
expect "CONFIG GET databases" $'databases\n1' "$(cli CONFIG GET databases)"

# Mass insert with --pipe: 100k SETs generated in RESP.
N=100000
awk -v n="$N" 'BEGIN {
    for (i = 0; i < n; i++) {
        k = "key:" i; v = "value:" i
        printf "*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n", length(k), k, length(v), v
    }
}' >"$WORK/mass.resp"
if pipe_out=$(timeout 120 redis-cli -h 127.0.0.1 -p "$PORT" --pipe <"$WORK/mass.resp" 2>&1); then
    contains "--pipe: $N replies, no errors" "errors: 0, replies: $N" "$pipe_out"
else
    bad "--pipe exited non-zero: $pipe_out"
fi
expect "DBSIZE after --pipe" "$N" "$(cli DBSIZE)"
expect "GET key:0" "value:0" "$(cli GET key:0)"
expect "GET key:54321" "value:54321" "$(cli GET key:54321)"
expect "GET key:99999" "value:99999" "$(cli GET key:99999)"
expect "EXISTS key:100000" "0" "$(cli EXISTS key:100000)"

# --scan visits every key exactly once.
cli --scan >"$WORK/scan.txt"
expect "--scan count" "$N" "$(wc -l <"$WORK/scan.txt" | tr -d ' ')"
expect "--scan unique" "$N" "$(sort -u "$WORK/scan.txt" | wc -l | tr -d ' ')"
cli --scan --pattern 'key:1*' >"$WORK/scan1.txt"
# key:1, key:10-19, key:100-199, key:1000-1999, key:10000-19999
expect "--scan --pattern key:1* count" "11111" "$(sort -u "$WORK/scan1.txt" | wc -l | tr -d ' ')"
expect "--scan --pattern key:1* no duplicates" "11111" "$(wc -l <"$WORK/scan1.txt" | tr -d ' ')"
expect "--scan --pattern key:9999? count" "10" "$(cli --scan --pattern 'key:9999?' | wc -l | tr -d ' ')"
expect "--scan --pattern none" "0" "$(cli --scan --pattern 'nothing:*' | wc -l | tr -d ' ')"

# RESP3 mode.
contains "-3 HELLO proto 3" '"proto" => (integer) 3' "$(cli -3 --no-raw HELLO 3)"
expect "-3 SET" "OK" "$(cli -3 SET r3 ohmytext)"
expect "-3 GET" "ohmytext" "$(cli -3 GET r3)"
expect "-3 --no-raw TTL" "(integer) -1" "$(cli -3 --no-raw TTL r3)"
expect "-3 --no-raw GET missing" "(nil)" "$(cli -3 --no-raw GET missing)"
expect "-3 INCRBYFLOAT" "3.5" "$(cli -3 INCRBYFLOAT f3 3.5)"
cli -3 SET r3b mynewtext >/dev/null
contains "-3 LCS IDX is a map" '1# "matches" =>' "$(cli -3 --no-raw LCS r3 r3b IDX)"
contains "-3 LCS IDX len" '2# "len" => (integer) 6' "$(cli -3 --no-raw LCS r3 r3b IDX)"
contains "-3 CONFIG GET is a map" '1# "maxmemory" =>' "$(cli -3 --no-raw CONFIG GET maxmemory)"
expect "FLUSHALL" "OK" "$(cli FLUSHALL)"

# A short redis-benchmark run must complete without errors.
if bench_out=$(timeout 300 redis-benchmark -h 127.0.0.1 -p "$PORT" -t set,get,mset,incr -P 16 -n 20000 -q 2>&1); then
    ok "redis-benchmark exit status"
else
    bad "redis-benchmark exited non-zero"
fi
bench_out=$(tr '\r' '\n' <<<"$bench_out")
for test in "SET" "GET" "MSET (10 keys)" "INCR"; do
    if grep -Eq "^$(sed 's/[()]/\\&/g' <<<"$test"): +[0-9.]+ requests per second" <<<"$bench_out"; then
        ok "redis-benchmark $test: $(grep -E "^$(sed 's/[()]/\\&/g' <<<"$test"):" <<<"$bench_out" | tail -1)"
    else
        bad "redis-benchmark $test: no requests per second"
    fi
done
if grep -qi "error" <<<"$bench_out"; then
    bad "redis-benchmark reported errors: $(grep -i error <<<"$bench_out" | head -3)"
else
    ok "redis-benchmark reported no errors"
fi
kill -0 "$PID" 2>/dev/null && ok "kvtier still running" || bad "kvtier died: $(tail -5 "$WORK/stderr")"

echo
echo "cli-checks: $PASSED passed, $FAILED failed"
[[ $FAILED -eq 0 ]]
