#!/usr/bin/env bash
# Make sure this machine can run wgrad's GPU tests: a Rust toolchain and a GPU adapter.
# On Linux without a Vulkan driver, installs Mesa's software driver (lavapipe) when run as
# root on Debian/Ubuntu; otherwise prints the command to run. macOS needs nothing (Metal).
set -euo pipefail

if ! command -v cargo >/dev/null 2>&1; then
  echo "cargo not found: install Rust 1.87 or newer (https://rustup.rs), then rerun." >&2
  exit 1
fi

[ "$(uname -s)" = "Darwin" ] && exit 0

have_loader() { ldconfig -p 2>/dev/null | grep -q 'libvulkan\.so\.1'; }
have_icd() {
  ls /usr/share/vulkan/icd.d/*.json /etc/vulkan/icd.d/*.json /usr/local/share/vulkan/icd.d/*.json \
    ${VK_DRIVER_FILES:+"$VK_DRIVER_FILES"} ${VK_ICD_FILENAMES:+"$VK_ICD_FILENAMES"} >/dev/null 2>&1
}

if have_loader && have_icd; then
  exit 0
fi

packages="mesa-vulkan-drivers libvulkan1"
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "no Vulkan driver found: installing $packages (software adapter, lavapipe)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq $packages >/dev/null
  exit 0
fi

echo "no Vulkan driver found. On Debian/Ubuntu run:" >&2
echo "    sudo apt-get install -y $packages" >&2
exit 1
