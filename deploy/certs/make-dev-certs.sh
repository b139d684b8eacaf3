#!/usr/bin/env bash
# Makes a development CA and certificates for pipetrain's mutual TLS:
#   make-dev-certs.sh OUT_DIR HOST[=ALSO[,ALSO...]]...
# writes OUT_DIR/ca.pem + ca-key.pem, for each HOST a HOST.pem + HOST-key.pem whose
# names (SANs) are HOST (DNS name or IP address), every ALSO (more names or addresses the
# host is reached at, such as a Slurm node's NodeAddr: n1=10.0.0.11), localhost and
# 127.0.0.1, and a client.pem + client-key.pem for the CLI. Every certificate serves as both server and
# client certificate. For tests and trials: keep ca-key.pem away from the cluster.
set -euo pipefail

usage() {
  echo "usage: $0 OUT_DIR HOST[=ALSO[,ALSO...]]..." >&2
  echo "  makes OUT_DIR/ca.pem, OUT_DIR/HOST.pem (+ -key.pem) per HOST and OUT_DIR/client.pem;" >&2
  echo "  each HOST.pem names HOST, every ALSO (names or addresses), localhost and 127.0.0.1" >&2
}

if [[ $# -lt 1 || "$1" == "-h" || "$1" == "--help" ]]; then
  usage
  [[ $# -ge 1 ]] && exit 0
  exit 2
fi
if ! command -v openssl >/dev/null; then
  echo "$0: openssl is not installed (bash deploy/install-deps.sh installs it)" >&2
  exit 1
fi

out=$1
shift
mkdir -p "$out"
days=825
# ECDSA P-256: as strong as RSA 3072 for this and made in milliseconds.
key_args=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1)

is_ip() {
  [[ "$1" =~ ^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+$ || "$1" == *:* ]]
}

# A name safe as a file name: host names and IPv4 addresses are; IPv6 colons are not.
file_name() {
  printf '%s' "${1//:/_}"
}

if [[ ! -f "$out/ca.pem" || ! -f "$out/ca-key.pem" ]]; then
  openssl req -x509 "${key_args[@]}" -nodes -sha256 -days "$days" \
    -keyout "$out/ca-key.pem" -out "$out/ca.pem" \
    -subj "/CN=pipetrain dev CA" \
    -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
  chmod 600 "$out/ca-key.pem"
fi

# make_cert NAME SAN_ENTRY...: NAME.pem and NAME-key.pem signed by the CA.
make_cert() {
  local name=$1
  shift
  local san
  san=$(IFS=,; echo "$*")
  local ext
  ext=$(mktemp)
  cat >"$ext" <<EXT
basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth,clientAuth
subjectAltName=$san
EXT
  openssl req "${key_args[@]}" -nodes -sha256 -keyout "$out/$name-key.pem" \
    -out "$out/$name.csr" -subj "/CN=$name" 2>/dev/null
  openssl x509 -req -in "$out/$name.csr" -CA "$out/ca.pem" -CAkey "$out/ca-key.pem" \
    -CAcreateserial -days "$days" -sha256 -extfile "$ext" -out "$out/$name.pem" 2>/dev/null
  rm -f "$out/$name.csr" "$ext"
  chmod 600 "$out/$name-key.pem"
}

# The SAN entry of a name or address ("" for localhost, already there).
san_of() {
  if is_ip "$1"; then
    echo "IP:$1"
  elif [[ "$1" != "localhost" ]]; then
    echo "DNS:$1"
  fi
}

for arg in "$@"; do
  host=${arg%%=*}
  names=("$host")
  if [[ "$arg" == *=* ]]; then
    IFS=, read -r -a also <<< "${arg#*=}"
    names+=("${also[@]}")
  fi
  sans=("DNS:localhost" "IP:127.0.0.1")
  for name in "${names[@]}"; do
    san=$(san_of "$name")
    [[ -n "$san" ]] && sans+=("$san")
  done
  make_cert "$(file_name "$host")" "${sans[@]}"
done
make_cert client "DNS:localhost" "IP:127.0.0.1"
rm -f "$out/ca.srl"

echo "made in $out: ca.pem, client.pem$(for h in "$@"; do printf ', %s.pem' "$(file_name "${h%%=*}")"; done) (each with its -key.pem)"
