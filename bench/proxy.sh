#!/usr/bin/env bash
# Runs the proxy-overhead benchmark (bench/proxy), installing Debian's
# nginx-light first when no nginx is on the machine (needs root or sudo).
# Every argument is passed to the benchmark, e.g.:
#
#   bench/proxy.sh -runs 5
#   bench/proxy.sh -runs 3 -profile prof   # CPU profiles in ./prof
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v nginx >/dev/null 2>&1 && [ ! -x /usr/sbin/nginx ]; then
	sudo=""
	if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
	echo "installing nginx-light (Debian) ..." >&2
	$sudo apt-get update -qq
	# RUNLEVEL=1: the package must not start its system-wide nginx on :80.
	DEBIAN_FRONTEND=noninteractive RUNLEVEL=1 $sudo apt-get install -y -qq nginx-light >/dev/null
fi

exec go run ./bench/proxy "$@"
