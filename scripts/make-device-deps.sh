#!/usr/bin/env bash
# scripts/make-device-deps.sh — copy what the lent GPU machine lacks into .device-deps/
# (ignored by git; name it in the device call's carry): GoogleTest/GoogleMock headers and
# static libraries (a GTEST_ROOT layout) and the CLI11 headers, from this machine's
# Debian packages (scripts/install-deps.sh installs them).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
deps=$root/.device-deps
lib=/usr/lib/$(gcc -print-multiarch)
mkdir -p "$deps/gtest/include" "$deps/gtest/lib"
cp -r /usr/include/gtest /usr/include/gmock "$deps/gtest/include/"
cp "$lib"/libgtest*.a "$lib"/libgmock*.a "$deps/gtest/lib/"
cp -r /usr/include/CLI "$deps/"
echo "made $deps ($(du -sh "$deps" | cut -f1))"
