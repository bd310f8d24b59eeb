# tests/gpu/ab_base.sh — sourced by tests/gpu/ab.sh and tests/gpu/ab_frontend.sh on the GPU
# machine: the base revision's tree (.ab/base.tar, written by `tests/gpu/ab.sh --pack REV`,
# unpacked over a copy of the working tree into build/ab-base) and the working tree each build
# the same targets, side by side.
#   ab_build NAME TARGET...   sets $out, $base; exits 1, saying why, when .ab/base.tar is missing
#                             or the first target did not build in either tree
ab_build() {
    local name=$1
    shift
    out=${OUT:-build/gpu-results}
    mkdir -p "$out"
    export CUDA_MODULE_LOADING=EAGER PATH=/usr/local/cuda/bin:$PATH
    [ -f .ab/base.tar ] || { echo "$name: no .ab/base.tar (run tests/gpu/ab.sh --pack here first)"; exit 1; }
    . tests/gpu/devdeps.sh
    base=build/ab-base
    rm -rf $base && mkdir -p $base
    tar --exclude=./build --exclude=./.peers --exclude=./.devdeps --exclude=./.whl -cf - . |
        tar -C $base -xf -
    tar -C $base -xf .ab/base.tar
    make -j8 B=build/gpu CUDA=1 CUDA_ARCHS=90a "$@" >"$out/ab_build_new.log" 2>&1 &
    (cd $base && make -j8 B=build/gpu CUDA=1 CUDA_ARCHS=90a "$@") >"$out/ab_build_base.log" 2>&1
    wait
    for d in . $base; do
        [ -x "$d/$1" ] || { tail -n 20 "$out"/ab_build_*.log; exit 1; }
    done
}
