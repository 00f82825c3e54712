#!/usr/bin/env bash
# Test certificates in DIR (made with the openssl command line): a CA "ca"
# that signed "server", "server2" and "client" (ECDSA P-256; names localhost
# and 127.0.0.1; usable as server and client certificates), and a second CA
# "other-ca" that signed "stranger". Used by tests/python/test_tls.py and
# scripts/bench-tls.sh.
set -euo pipefail
dir=${1:?usage: test-certs.sh DIR}
mkdir -p "$dir"
cd "$dir"
ca() {
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -keyout "$1.key" -out "$1.crt" -days 2 -subj "/CN=$1" 2>/dev/null
}
cert() {
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -keyout "$1.key" -out "$1.csr" -subj "/CN=$1" 2>/dev/null
  printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\nbasicConstraints=CA:FALSE\n' >"$1.ext"
  openssl x509 -req -in "$1.csr" -CA "$2.crt" -CAkey "$2.key" -CAcreateserial \
    -out "$1.crt" -days 2 -extfile "$1.ext" 2>/dev/null
}
ca ca
ca other-ca
for who in server server2 client; do cert "$who" ca; done
cert stranger other-ca
