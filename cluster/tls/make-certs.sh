#!/usr/bin/env bash
# A private CA and one certificate per role (scheduler, worker, client) for a Dask cluster that speaks
# TLS, plus a Dask config folder that uses them:
#   bash cluster/tls/make-certs.sh OUT_DIR [HOST ...]      (HOSTs: names/IPs put in the certs, default 127.0.0.1)
# OUT_DIR then holds ca.pem, ca-key.pem (keep it off the cluster), scheduler.pem, worker.pem, client.pem
# (certificate + key in one file each: give a box only the one its role needs) and config/: this
# project's cluster/dask.yaml plus tls.yaml naming the files, for DASK_CONFIG=OUT_DIR/config.
# Every member checks the other side's certificate against ca.pem: a client or worker without a
# certificate signed by this CA cannot connect, so only holders of client.pem can run code on the workers.
set -euo pipefail
out=${1:?usage: make-certs.sh OUT_DIR [HOST ...]}
shift
hosts=("${@:-127.0.0.1}")
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out/config"
out=$(cd "$out" && pwd)
umask 077
san=""
for h in "${hosts[@]}"; do
  if [[ $h =~ ^[0-9.]+$ || $h == *:* ]]; then san+="IP:$h,"; else san+="DNS:$h,"; fi
done
san=${san%,}
openssl req -x509 -newkey rsa:2048 -nodes -days 365 -subj "/CN=qnn-npu-compile cluster CA" \
  -keyout "$out/ca-key.pem" -out "$out/ca.pem" 2>/dev/null
for role in scheduler worker client; do
  openssl req -newkey rsa:2048 -nodes -subj "/CN=qnn-npu-compile $role" \
    -keyout "$out/$role-key.tmp" -out "$out/$role.csr" 2>/dev/null
  printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\n' "$san" > "$out/$role.ext"
  openssl x509 -req -in "$out/$role.csr" -CA "$out/ca.pem" -CAkey "$out/ca-key.pem" -CAcreateserial \
    -days 365 -extfile "$out/$role.ext" -out "$out/$role-cert.tmp" 2>/dev/null
  cat "$out/$role-cert.tmp" "$out/$role-key.tmp" > "$out/$role.pem"
  rm -f "$out/$role.csr" "$out/$role.ext" "$out/$role-cert.tmp" "$out/$role-key.tmp"
done
rm -f "$out/ca.srl"
cp "$here/../dask.yaml" "$out/config/dask.yaml"
cat > "$out/config/tls.yaml" <<YAML
# Made by cluster/tls/make-certs.sh: Dask's TLS settings for every member of the cluster.
distributed:
  comm:
    require-encryption: true      # no plain tcp:// connection is accepted or made
    tls:
      ca-file: $out/ca.pem
      scheduler: {cert: $out/scheduler.pem}
      worker: {cert: $out/worker.pem}
      client: {cert: $out/client.pem}
YAML
chmod 644 "$out/ca.pem" "$out/config/dask.yaml" "$out/config/tls.yaml"
echo "certificates in $out; use DASK_CONFIG=$out/config"
