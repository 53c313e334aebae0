#!/usr/bin/env bash
# Builds and tests drmas against Debian trixie's libtorch 2.6 in a chroot, beside the libtorch this machine
# has (Debian bookworm's 1.13): set-up, the c10d shim and the Go code meet the libtorch 2.x API that GPU
# machines run (PyTorch's wheels), and the NCCL build path is compiled, all without a GPU.
#
#   scripts/libtorch-check.sh cpu    # libtorch-dev 2.6: set-up, build, go vet, go test ./...
#   scripts/libtorch-check.sh cuda   # libtorch-cuda-dev 2.6 with NCCL 2.22 and CUDA 12.4's headers, given as
#                                    # LIBTORCH=folder: set-up builds the c10d shim with ProcessGroupNCCL, drmas
#                                    # links against the CUDA libraries, go vet and go test ./... run on the CPU,
#                                    # and an NCCL rendezvous is tried (it must get as far as ProcessGroupNCCL
#                                    # refusing a machine without GPUs)
#
# TESTS (default ./...) narrows the test step to some packages, and RUN to some tests (go test -run), for a
# quicker check of one change: TESTS=./pkg/policy/ RUN=Attention scripts/libtorch-check.sh cpu
#
# Needs root, debootstrap and rsync (apt-get install debootstrap rsync) and Debian's mirror (MIRROR). The first
# run of a kind makes its chroot (cpu: ~1 GB of packages, cuda: ~2.6 GB) and takes 15-25 minutes on 2 cores;
# later runs copy this tree into it again and rebuild (set-up reuses its compiled wrappers when unchanged).
# The chroot stays in CHROOT_DIR (default /var/tmp/drmas-chroot); this machine's Go and module cache are
# bind-mounted into it, and unmounted when the script ends.
#
# cuDNN: Debian's nvidia-cudnn package downloads cuDNN from NVIDIA when installed, which this machine cannot
# reach. The cuda chroot gets an empty package of that name instead, and a placeholder libcudnn.so.9 that
# defines the functions libtorch_cuda.so imports, each aborting with its name if called: enough to link and
# load, never called on a machine without a GPU. Nothing of it leaves the chroot.
set -euo pipefail
kind=${1:-}
case "$kind" in
cpu) pkgs="libtorch-dev libgloo-dev" ;;
cuda) pkgs="libtorch-cuda-dev libgloo-cuda-dev libnccl-dev nvidia-cuda-dev" ;;
*)
	echo "usage: $0 cpu|cuda" >&2
	exit 2
	;;
esac
[ "$(id -u)" = 0 ] || { echo "$0: needs root (debootstrap, chroot, mounts)" >&2; exit 2; }
for tool in debootstrap rsync go; do
	command -v $tool >/dev/null || { echo "$0: needs $tool (apt-get install debootstrap rsync)" >&2; exit 2; }
done
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${CHROOT_DIR:-/var/tmp/drmas-chroot}/trixie-$kind
mirror=${MIRROR:-http://deb.debian.org/debian}
goroot=$(go env GOROOT)
gomod=$(go env GOMODCACHE)

mounts=(proc dev dev/pts sys "${goroot#/}" "${gomod#/}")
unmount() {
	local i
	for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do
		mountpoint -q "$dir/${mounts[i]}" && umount "$dir/${mounts[i]}" || true
	done
}
trap unmount EXIT
mount_all() {
	mkdir -p "$dir$goroot" "$dir$gomod"
	mountpoint -q "$dir/proc" || mount -t proc proc "$dir/proc"
	for m in dev dev/pts sys; do
		mountpoint -q "$dir/$m" || mount --bind "/$m" "$dir/$m"
	done
	mountpoint -q "$dir$goroot" || mount --bind -o ro "$goroot" "$dir$goroot"
	mountpoint -q "$dir$gomod" || mount --bind "$gomod" "$dir$gomod"
}
inside() {
	chroot "$dir" env -i HOME=/root PATH="$goroot/bin:/usr/local/bin:/usr/bin:/bin" GOMODCACHE="$gomod" \
		GOCACHE=/root/.cache/go-build GOFLAGS= GOTOOLCHAIN=local TERM=dumb bash -c "cd /src/drmas && $1"
}

t0=$SECONDS
if [ ! -f "$dir/.drmas-ready" ]; then
	echo "=== making the trixie chroot ($kind) in $dir" >&2
	[ -d "$dir/usr" ] || debootstrap --variant=minbase --include=ca-certificates trixie "$dir" "$mirror" >&2
	echo "deb $mirror trixie main contrib non-free" >"$dir/etc/apt/sources.list"
	rm -f "$dir"/etc/apt/sources.list.d/*
	cp /etc/resolv.conf /etc/hosts "$dir/etc/"
	mount_all
	chroot "$dir" apt-get update -qq
	if [ "$kind" = cuda ]; then
		chroot "$dir" bash -c 'DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends equivs >/dev/null &&
			cd /tmp && printf "Package: nvidia-cudnn\nVersion: 9.0.0.312~cuda12\nDescription: placeholder (cuDNN is a download from NVIDIA)\n" >cudnn.ctl &&
			equivs-build cudnn.ctl >/dev/null 2>&1 && dpkg -i nvidia-cudnn_*.deb >/dev/null'
	fi
	chroot "$dir" bash -c "DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $pkgs \
		libopenblas0-pthread gcc g++ make git ca-certificates >/dev/null && apt-get clean"
	if [ "$kind" = cuda ]; then
		lib=/usr/lib/x86_64-linux-gnu
		{
			echo '#include <stdio.h>'
			echo '#include <stdlib.h>'
			echo 'static void none(const char *f) { fprintf(stderr, "placeholder libcudnn: %s called\n", f); abort(); }'
			objdump -T "$dir$lib/libtorch_cuda.so" | awk '/\*UND\*/ && /\(libcudnn\.so\.9\)/ {print $NF}' | sort -u |
				while read -r s; do echo "void $s(void) { none(\"$s\"); }"; done
		} >"$dir/tmp/cudnn.c"
		echo 'libcudnn.so.9 { global: *; };' >"$dir/tmp/cudnn.map"
		chroot "$dir" gcc -shared -fPIC -o $lib/libcudnn.so.9 -Wl,-soname,libcudnn.so.9 -Wl,--version-script=/tmp/cudnn.map /tmp/cudnn.c
	fi
	touch "$dir/.drmas-ready"
fi
mount_all
mkdir -p "$dir/src/drmas"
rsync -a --delete --exclude /.torch --exclude /bin --exclude /go.work --exclude /go.work.sum --exclude /.cache \
	--exclude /.device --exclude /runs --exclude /.git "$root/" "$dir/src/drmas/"

summary=()
failed=0
check() { # check NAME CMD: runs CMD inside, output to the chroot's /src/drmas/NAME.log
	local name=$1 t=$SECONDS
	echo "=== $name: $2" >&2
	if inside "$2" >"$dir/src/drmas/$name.log" 2>&1; then
		summary+=("$(printf '%-8s ok    %ss' "$name" $((SECONDS - t)))")
	else
		failed=1
		tail -n 30 "$dir/src/drmas/$name.log" >&2
		summary+=("$(printf '%-8s FAIL  %ss (log: %s)' "$name" $((SECONDS - t)) "$dir/src/drmas/$name.log")")
	fi
}
if [ "$kind" = cuda ]; then
	# The way a user hands over a CUDA libtorch (LIBTORCH=folder with include/ and lib/, as the official zip
	# and a PyTorch install's torch/ are laid out); the cpu kind takes the system libtorch instead.
	mkdir -p "$dir/opt/libtorch-cuda"
	ln -sfn /usr/include "$dir/opt/libtorch-cuda/include"
	ln -sfn /usr/lib/x86_64-linux-gnu "$dir/opt/libtorch-cuda/lib"
	check setup 'LIBTORCH=/opt/libtorch-cuda make setup'
else
	check setup 'make setup'
fi
grep -E 'libtorch|stubs|c10d|WARNING' "$dir/src/drmas/setup.log" | sed 's/^/  /' >&2 || true
check build 'go build -o bin/drmas ./cmd/drmas && bin/drmas version'
[ $failed = 0 ] && sed 's/^/  /' "$dir/src/drmas/build.log" | tail -n 5 >&2
if [ "$kind" = cuda ]; then
	# The NCCL path end to end as far as a machine without GPUs allows: the shim was built with it, and a
	# rendezvous reaches ProcessGroupNCCL, whose constructor refuses for want of a GPU.
	check nccl 'grep -q "^#define DRMAS_WITH_NCCL" .torch/gotch/libtch/drmas_c10d_config.h &&
		bin/drmas version | grep -q "data-parallel (c10d): gloo, nccl" &&
		{ WORLD_SIZE=1 RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29631 bin/drmas train --config configs/toy-math.yaml \
			--set dist.backend=nccl --set run.dir=/tmp/nccl-run --force 2>&1; true; } | tee /dev/stderr |
		grep -q "ProcessGroupNCCL is only supported with GPUs"'
fi
check vet 'go vet ./...'
check test "go test -count=1 -timeout 25m ${RUN:+-run '$RUN'} ${TESTS:-./...}"
grep -E '^(ok|FAIL|---)' "$dir/src/drmas/test.log" | sed 's/^/  /' >&2 || true

echo
echo "=== drmas against Debian trixie's libtorch 2.6 ($kind), $((SECONDS - t0))s"
printf '%s\n' "${summary[@]}"
exit $failed
