#!/usr/bin/env bash
# Installs the CUDA toolkit's compiler, runtime and driver headers inside a manylinux_2_28 image
# (AlmaLinux 8, dnf), for the wheel builds: cibuildwheel runs it once per container (before-all in
# the [tool.cibuildwheel.linux] tables of pyproject.toml). See docs/install.md, "Building the wheels".
#
# Environment (passed into the container through cibuildwheel's environment-pass):
#   KVCODEC_CUDA_REPO_URL     required. Base URL of the CUDA package repository for RHEL 8: the folder
#                             that holds one repository per architecture, x86_64/ and sbsa/ (NVIDIA's
#                             layout, or a mirror of it). The repository names no host itself.
#   KVCODEC_CUDA_VERSION      toolkit version, major.minor (default 13.0; the sources need 13.0 or later).
#   KVCODEC_CUDA_REPO_GPGKEY  URL or path of the repository's signing key
#                             (default: $KVCODEC_CUDA_REPO_URL/<arch>/D42D0685.pub).
#   KVCODEC_CUDA_PACKAGES     packages to install instead of the default set (space-separated).
#   KVCODEC_CUDA_ARCHITECTURES  if set (the wheel builds set it), every architecture in it is checked
#                             against the installed nvcc before any build starts.
set -euo pipefail

die() { echo "install-cuda-manylinux.sh: $*" >&2; exit 1; }

repo_url=${KVCODEC_CUDA_REPO_URL:-}
[[ -n "$repo_url" ]] || die "KVCODEC_CUDA_REPO_URL is not set: give the base URL of the CUDA RHEL 8 package repository (the folder holding x86_64/ and sbsa/); cibuildwheel passes it from the host's environment"
repo_url=${repo_url%/}

version=${KVCODEC_CUDA_VERSION:-13.0}
[[ "$version" =~ ^([0-9]+)\.([0-9]+)$ ]] || die "KVCODEC_CUDA_VERSION=$version: expected major.minor, for example 13.0"
major=${BASH_REMATCH[1]}
(( major >= 13 )) || die "KVCODEC_CUDA_VERSION=$version: the sources need CUDA 13.0 or later (the 13.0 cuMemcpyBatchAsync signature)"
suffix="${major}-${BASH_REMATCH[2]}"

case "$(uname -m)" in
  x86_64) repo_arch=x86_64 ;;
  aarch64) repo_arch=sbsa ;;
  *) die "machine $(uname -m): only x86_64 and aarch64 wheels are built" ;;
esac

command -v dnf >/dev/null || die "dnf not found: this script is for the manylinux_2_28 images (AlmaLinux 8)"

gpgkey=${KVCODEC_CUDA_REPO_GPGKEY:-$repo_url/$repo_arch/D42D0685.pub}
cat > /etc/yum.repos.d/kvcodec-cuda.repo <<EOF
[kvcodec-cuda]
name=CUDA ($repo_arch)
baseurl=$repo_url/$repo_arch
enabled=1
gpgcheck=1
gpgkey=$gpgkey
EOF

# nvcc, cudart (static library and headers, cuda_fp8.h/cuda_bf16.h included) and the driver API
# headers (cuda.h, cudaTypedefs.h). Nothing links libcuda; nvCOMP comes from its wheel at build time.
# shellcheck disable=SC2206
packages=(${KVCODEC_CUDA_PACKAGES:-cuda-minimal-build-$suffix cuda-driver-devel-$suffix})
echo "Installing ${packages[*]} from $repo_url/$repo_arch"
dnf install -y --setopt=install_weak_deps=False "${packages[@]}"
dnf clean all

prefix=/usr/local/cuda-$version
[[ -x "$prefix/bin/nvcc" ]] || die "$prefix/bin/nvcc is missing after the install (packages: ${packages[*]})"
if [[ ! -e /usr/local/cuda ]]; then
  ln -s "$prefix" /usr/local/cuda
fi
/usr/local/cuda/bin/nvcc --version

# A wheel build should not discover a missing architecture after an hour of compiling.
if [[ -n "${KVCODEC_CUDA_ARCHITECTURES:-}" ]]; then
  codes=" $(/usr/local/cuda/bin/nvcc --list-gpu-code | tr '\n' ' ') "
  virtuals=" $(/usr/local/cuda/bin/nvcc --list-gpu-arch | tr '\n' ' ') "
  IFS=';' read -r -a archs <<< "$KVCODEC_CUDA_ARCHITECTURES"
  for arch in "${archs[@]}"; do
    number=${arch%%-*}
    case "$arch" in
      *-virtual) [[ "$virtuals" == *" compute_$number "* ]] || die "KVCODEC_CUDA_ARCHITECTURES: $arch: nvcc $version has no compute_$number (it has:$virtuals)" ;;
      *-real) [[ "$codes" == *" sm_$number "* ]] || die "KVCODEC_CUDA_ARCHITECTURES: $arch: nvcc $version has no sm_$number (it has:$codes)" ;;
      *) [[ "$codes" == *" sm_$number "* && "$virtuals" == *" compute_$number "* ]] \
           || die "KVCODEC_CUDA_ARCHITECTURES: $arch: nvcc $version lacks sm_$number or compute_$number" ;;
    esac
  done
  echo "nvcc $version accepts KVCODEC_CUDA_ARCHITECTURES=$KVCODEC_CUDA_ARCHITECTURES"
fi
