#!/bin/sh
# Installs Debian's chromium package for the dashboard's browser test.
#
# Exit status: 0 when chromium is installed (or already was); 3 when it
# cannot be installed here (neither root nor password-less sudo, no
# apt-get, or apt-get failed, e.g. offline); the test then skips.
set -u
if command -v chromium >/dev/null 2>&1; then
	exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
	echo "install-chromium: no apt-get on this machine; install chromium by hand" >&2
	exit 3
fi
if [ "$(id -u)" = 0 ]; then
	as=""
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
	as="sudo -n"
else
	echo "install-chromium: not root and no password-less sudo; run: apt-get install chromium" >&2
	exit 3
fi
export DEBIAN_FRONTEND=noninteractive
# Wait for another apt or dpkg run to finish instead of failing on its lock.
lock="-o DPkg::Lock::Timeout=300"
if ! $as apt-get $lock update -qq; then
	echo "install-chromium: apt-get update failed" >&2
	exit 3
fi
if ! $as apt-get $lock install -y -qq chromium; then
	echo "install-chromium: apt-get install chromium failed" >&2
	exit 3
fi
command -v chromium >/dev/null 2>&1 || exit 3
