# The two commands a new user needs: `make run` and `make test`. Both install
# missing build dependencies (Debian packages), configure and build first.
BUILD ?= build
BUILD_ASAN ?= build-asan
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

# Build: compiler, CMake, the libraries. Tests: promtool (prometheus), systemd's
# tools (systemd-analyze, systemd-socket-activate, sysusers/tmpfiles), setpriv
# (util-linux), groff/man for the man pages, python3 (+yaml) for checkers,
# dpkg-dev for the package check.
DEB_PACKAGES := cmake pkg-config gcc make libuv1-dev libprotobuf-c-dev protobuf-c-compiler \
	libsystemd-dev check libinih-dev libmicrohttpd-dev python3 python3-yaml util-linux \
	prometheus systemd groff-base man-db dpkg-dev

.PHONY: all deps build run test test-asan install clean

all: build

deps:
	@missing=""; for p in $(DEB_PACKAGES); do \
		dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
		echo "Installing build dependencies:$$missing"; \
		SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
		$$SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q $$missing; \
	fi

$(BUILD)/Makefile: deps
	cmake -S . -B $(BUILD) $(CMAKE_FLAGS)

build: deps
	cmake -S . -B $(BUILD) $(CMAKE_FLAGS)
	cmake --build $(BUILD) -j $(JOBS)

# Runs gpumemd in the foreground on the embedded default (host backend), with a
# short demo workload from a few client processes once it is up.
run: build
	@GPUMEMD=$(BUILD)/daemon/gpumemd GPUMEMCTL=$(BUILD)/client/gpumemctl DEMO=$(BUILD)/client/gpumem-demo \
		./scripts/run.sh

test: build
	cd $(BUILD) && ctest --output-on-failure -j 2

# The same suite under AddressSanitizer and UndefinedBehaviorSanitizer, with
# the debug checks (gm_heap_check, gm_broker_check after every operation).
test-asan: deps
	cmake -S . -B $(BUILD_ASAN) -DGPUMEMD_ASAN=ON -DGPUMEMD_DEBUG=ON $(CMAKE_FLAGS)
	cmake --build $(BUILD_ASAN) -j $(JOBS)
	cd $(BUILD_ASAN) && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j 2

install: build
	cmake --install $(BUILD)

clean:
	rm -rf $(BUILD) $(BUILD_ASAN)
