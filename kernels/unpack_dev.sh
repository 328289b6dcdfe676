# Sourced by the GPU-machine scripts (kernels/gpu_checks.sh, tests/bench/gpu_vs_llamacpp.sh), from
# the repo root: `unpack_dev` puts the carried build (.devz/dev.tar.xz, from kernels/prepare_device.sh)
# into .dev, and says which build will run. A warm machine may keep the .dev of an earlier call, so
# the tarball's checksum is kept in .dev/.stamp and .dev is unpacked afresh whenever they differ:
# the build that runs is always the one carried.
unpack_dev() {
    local z=.devz/dev.tar.xz sum
    if [ ! -f $z ]; then
        [ -x .dev/run ] || { echo "FAIL no binaries: carry .devz (kernels/prepare_device.sh)"; return 1; }
        echo "build: .dev as found, no .devz carried (not checked against this tree)"
    else
        sum=$(sha256sum $z | cut -c1-16) || return 1
        if [ "$(cat .dev/.stamp 2>/dev/null)" != "$sum" ] || [ ! -x .dev/run ]; then
            rm -rf .dev && mkdir -p .dev && tar xJf $z -C .dev && echo "$sum" > .dev/.stamp ||
                { echo "FAIL cannot unpack $z"; return 1; }
            echo "build: unpacked $z (sha256 $sum)"
        else
            echo "build: .dev already holds $z (sha256 $sum)"
        fi
    fi
    echo "build: $(cat .dev/BUILD 2>/dev/null || echo 'no .dev/BUILD'); $(LD_LIBRARY_PATH=$PWD/.dev/lib:/usr/local/cuda/lib64 .dev/run --version 2>&1 | head -1)"
}
