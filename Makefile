# Thin wrapper around meson: every target installs what it needs first (tools/install-deps.sh).
#   make golden  record the golden PCRs of the guest image on this host (one learn-mode VM, about 7
#                minutes under TCG): VMs that must attest (the default) verify against them
#   make install the daemon, its systemd units, service user and polkit rule (docs/install.md), under
#                prefix (default /usr/local) below DESTDIR; vm-agent belongs in the guest and stays out
#   make container-image  the container image (deploy/container/build.sh: an mmdebstrap root and
#                buildah) as CONTAINER_IMAGE, in the containers storage under /var/cache/vm-manager
#   make run     build, then serve in the foreground (state in ./state unless STATE_DIR or
#                VM_MANAGER_STATE_DIR says otherwise; ARGS="--listen :9090" adds serve flags)
#   make check   build with ASan/UBSan and run every test that can run on this machine: after the
#                image suite the README's commands in fresh Debian 12 and 13 roots (suites fresh-root,
#                fresh-root-trixie), the CI subset of the end-to-end suite (suite e2e-ci) last
#   make bench   run bench/ and print the figures that go into docs/benchmarks.md
#   make e2e     real boots of the guest image through the daemon, every test (tests/e2e; about
#                25 minutes under TCG; E2E_TESTS=create,fresh picks tests)
#   make image   build the guest image into images/build (or take it from the cache; images/README.md)
#   make image-verify  check images/build's policy.json and signed manifests against its files
#   make image-smoke   boot images/build under TCG without the daemon (install, READY=1, PCR 11)
#   make image-push REF=host/repo:tag  publish images/build's image to a registry (OCI_ARGS="--plain-http …")
#   make image-pull REF=host/repo:tag  install an image from a registry into images/build
#   make tools-doc  regenerate docs/tools.md from the operation table
#   make fuzz    run each libFuzzer target for FUZZ_SECONDS (clang)

BUILD ?= build
CHECK_BUILD ?= build-asan
STATE_DIR ?= $(or $(VM_MANAGER_STATE_DIR),$(CURDIR)/state)
ARGS ?=
SUITES ?= unit integration fuzz style image fresh-root fresh-root-trixie deploy e2e-ci

IMAGE_DIR ?= $(CURDIR)/images/build
prefix ?= /usr/local
CONTAINER_IMAGE ?= localhost/vm-manager:dev

.PHONY: all deps-run deps-check deps-bench build build-check install container-image run check e2e bench fuzz format \
	tools-doc clean image image-verify image-smoke golden image-push image-pull

all: build

deps-run:
	@./tools/install-deps.sh build run

deps-check:
	@./tools/install-deps.sh build check image

deps-bench:
	@./tools/install-deps.sh build bench

$(BUILD)/build.ninja:
	meson setup $(BUILD) --buildtype=debugoptimized

$(CHECK_BUILD)/build.ninja:
	meson setup $(CHECK_BUILD) --buildtype=debug -Db_sanitize=address,undefined -Dtests=enabled

build: deps-run $(BUILD)/build.ninja
	ninja -C $(BUILD)

build-check: deps-check $(CHECK_BUILD)/build.ninja
	ninja -C $(CHECK_BUILD)

install: build
	meson configure $(BUILD) -Dprefix=$(prefix)
	DESTDIR="$(DESTDIR)" meson install -C $(BUILD)

container-image: build
	@./tools/install-deps.sh deploy
	./deploy/container/build.sh $(BUILD)/src/daemon/vm-manager $(CONTAINER_IMAGE)

# The daemon serves the guest image that images/ builds (taken from the cache after the first build).
run: build image
	exec $(BUILD)/src/daemon/vm-manager serve --state-dir "$(STATE_DIR)" --image-dir "$(IMAGE_DIR)" $(ARGS)

image: build
	$(MAKE) -C images image OUT="$(IMAGE_DIR)"

# Once per image and host firmware, beside or before `make run` (tools/golden.sh).
golden: build image
	./tools/golden.sh $(BUILD)/src/daemon/vm-manager "$(IMAGE_DIR)"

image-verify:
	$(MAKE) -C images image-verify OUT="$(IMAGE_DIR)"

image-smoke:
	$(MAKE) -C images smoke OUT="$(IMAGE_DIR)"

# docs/image-distribution.md; credentials from OCI_ARGS="--username u --password-stdin" (and stdin)
# or a docker/podman login
IMAGE_ID ?= giantswarm-vm-base
OCI_ARGS ?=
image-push: image
	@test -n "$(REF)" || { echo "make image-push: give REF=host[:port]/repository:tag" >&2; exit 1; }
	$(BUILD)/src/daemon/vm-manager image push --image-dir "$(IMAGE_DIR)" $(OCI_ARGS) $(IMAGE_ID) "$(REF)"

image-pull: build
	@test -n "$(REF)" || { echo "make image-pull: give REF=host[:port]/repository:tag" >&2; exit 1; }
	$(BUILD)/src/daemon/vm-manager image pull --image-dir "$(IMAGE_DIR)" $(OCI_ARGS) "$(REF)"

check: build-check
	meson test -C $(CHECK_BUILD) --print-errorlogs $(addprefix --suite ,$(SUITES))

e2e: build-check
	meson test -C $(CHECK_BUILD) --print-errorlogs --suite e2e

bench: deps-bench build
	./bench/run.sh $(BUILD)/src/daemon/vm-manager
	./bench/metrics.sh $(BUILD)/src/daemon/vm-manager
	./bench/mcp-keepalive.py $(BUILD)/src/daemon/vm-manager
	./bench/hardening.sh $(BUILD)/src/daemon/vm-manager

# docs/tools.md is generated from the operation table; the tools-doc test fails when it is stale.
tools-doc: build
	./tools/gen-tools-doc.py $(BUILD)/src/daemon/vm-manager docs/tools.md

# libFuzzer with clang, each target for FUZZ_SECONDS, starting from the committed seed corpus.
FUZZ_BUILD ?= build-fuzz
FUZZ_SECONDS ?= 60
fuzz:
	@./tools/install-deps.sh fuzz
	test -f $(FUZZ_BUILD)/build.ninja || CC=$$(command -v clang-14 || command -v clang-19) meson setup $(FUZZ_BUILD) -Dfuzzer=true \
		-Db_sanitize=address,undefined -Db_lundef=false
	ninja -C $(FUZZ_BUILD)
	for t in json-body mcp-post oci-manifest oci-tar oci-auth; do \
		mkdir -p $(FUZZ_BUILD)/corpus/$$t && cp -n tests/fuzz/corpus/$$t/* $(FUZZ_BUILD)/corpus/$$t/; \
		$(FUZZ_BUILD)/tests/fuzz/fuzz-$$t -max_total_time=$(FUZZ_SECONDS) -max_len=65536 \
			$(FUZZ_BUILD)/corpus/$$t || exit 1; \
	done

format:
	git ls-files '*.c' '*.h' | xargs clang-format-14 -i

clean:
	rm -rf $(BUILD) $(CHECK_BUILD)
