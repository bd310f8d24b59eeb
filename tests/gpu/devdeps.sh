# Sourced by the GPU scripts (run.sh, ablate.sh) from the repository root: the C dependencies the
# GPU host lacks, brought as .deb files in .devdeps (../shared/gpu/README.md), unpacked under
# /opt/patd-deps and put on the compiler's and loader's paths. Does nothing where they are
# installed already.
if [ -d .devdeps ] && ! [ -e /usr/include/xxhash.h ]; then
    P=/opt/patd-deps
    mkdir -p $P
    for f in .devdeps/*.deb; do dpkg -x "$f" $P; done
    L=$P/usr/lib/x86_64-linux-gnu
    for l in $L/*.so; do # -dev links to runtimes the host already has (libsystemd.so.0)
        [ -e "$l" ] && continue
        t=/usr/lib/x86_64-linux-gnu/$(basename "$(readlink "$l")")
        [ -e "$t" ] || t=$(ls /usr/lib/x86_64-linux-gnu/"$(basename "$l")".[0-9]* 2>/dev/null | head -1)
        [ -n "$t" ] && ln -sf "$t" "$l"
    done
    export CPATH=$P/usr/include LIBRARY_PATH=$L LD_LIBRARY_PATH=$L \
        PKG_CONFIG_SYSROOT_DIR=$P PKG_CONFIG_PATH=$L/pkgconfig:$P/usr/share/pkgconfig
fi
