# The two commands a new user needs: `make run` and `make test`. Both install
# missing build dependencies (Debian packages), configure and build first.
BUILD ?= build
BUILD_ASAN ?= build-asan
BUILD_FUZZ ?= build-fuzz
BUILD_RELEASE ?= build-release
FUZZ_SECONDS ?= 4
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
# `make install` puts everything under PREFIX (cmake's CMAKE_INSTALL_PREFIX,
# given at install time): binaries, libraries, the Python package, the
# systemd units (which name PREFIX's paths) and the configuration in
# PREFIX/etc/gpumem (/etc/gpumem for PREFIX=/usr). DESTDIR stages it.
PREFIX ?= /usr/local
DESTDIR ?=

# Build: compiler, CMake, the libraries. Tests: promtool (prometheus), systemd's
# tools (systemd-analyze, systemd-socket-activate, sysusers/tmpfiles), setpriv
# (util-linux), groff/man for the man pages, python3 (+yaml) for checkers,
# dpkg-dev, debhelper, dh-python, lintian and fakeroot (when not root) for the Debian
# package check, python3-pytest for the gpumem Python package, clang-format for
# the style check.
DEB_PACKAGES := cmake pkg-config gcc make libuv1-dev libprotobuf-c-dev protobuf-c-compiler \
	libsystemd-dev check libinih-dev libmicrohttpd-dev python3 python3-yaml util-linux \
	prometheus systemd groff-base man-db dpkg-dev debhelper dh-python lintian fakeroot python3-pytest \
	clang-format

# The fuzz harnesses (tests/fuzz, docs/fuzzing.md) need clang's libFuzzer;
# only `make fuzz` installs it.
FUZZ_PACKAGES := clang libclang-rt-dev

.PHONY: all deps deps-fuzz build build-release run test test-unit test-integration test-stress test-asan fuzz install deb clean

all: build

# apt-get waits up to 5 minutes for the package manager's lock (another apt
# or unattended-upgrades at work) instead of failing at once.
deps-fuzz: PACKAGES = $(DEB_PACKAGES) $(FUZZ_PACKAGES)
deps: PACKAGES = $(DEB_PACKAGES)
deps deps-fuzz:
	@missing=""; for p in $(PACKAGES); do \
		dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
		echo "Installing build dependencies:$$missing"; \
		SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
		$$SUDO apt-get -o DPkg::Lock::Timeout=300 update -q && \
			DEBIAN_FRONTEND=noninteractive $$SUDO apt-get -o DPkg::Lock::Timeout=300 install -y -q $$missing; \
	fi

$(BUILD)/Makefile: deps
	cmake -S . -B $(BUILD) $(CMAKE_FLAGS)

build: deps
	cmake -S . -B $(BUILD) $(CMAKE_FLAGS)
	cmake --build $(BUILD) -j $(JOBS)

# The optimized build, compiled only: -O3 finds warnings (-Werror) the default
# build does not, and every build type must compile cleanly.
build-release: deps
	cmake -S . -B $(BUILD_RELEASE) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)
	cmake --build $(BUILD_RELEASE) -j $(JOBS)

# Runs gpumemd in the foreground on the embedded default (host backend), with a
# short demo workload from a few client processes once it is up.
run: build
	@GPUMEMD=$(BUILD)/daemon/gpumemd GPUMEMCTL=$(BUILD)/ctl/gpumemctl DEMO=$(BUILD)/examples/gpumem-demo \
		./scripts/run.sh

test: build
	cd $(BUILD) && ctest --output-on-failure -j 2

# One group of the suite each (tests/CMakeLists.txt labels every test by its
# folder). test-unit: the pure modules in one process and the tree checks
# (format, layers), no daemon, seconds; test-integration: real daemons, client
# processes and packaging tools; test-stress: the random and replayed workloads.
test-unit: build
	cd $(BUILD) && ctest --output-on-failure -j 2 -L '^(unit|checks)$$'

test-integration: build
	cd $(BUILD) && ctest --output-on-failure -j 2 -L '^integration$$'

test-stress: build
	cd $(BUILD) && ctest --output-on-failure -j 2 -L '^stress$$'

# The same suite under AddressSanitizer and UndefinedBehaviorSanitizer, with
# the debug checks (gm_heap_check, gm_broker_check after every operation).
# packaging_deb and system_systemd are left out: dpkg-buildpackage builds its
# own plain binaries, so they would only repeat the first leg's checks.
test-asan: deps
	cmake -S . -B $(BUILD_ASAN) -DGPUMEMD_ASAN=ON -DGPUMEMD_DEBUG=ON $(CMAKE_FLAGS)
	cmake --build $(BUILD_ASAN) -j $(JOBS)
	cd $(BUILD_ASAN) && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j 2 -E '^(packaging_deb|system_systemd)$$'

# Every libFuzzer harness for FUZZ_SECONDS over its seed corpus (clang, ASan+UBSan).
fuzz: deps-fuzz
	CC=clang cmake -S . -B $(BUILD_FUZZ) -DGPUMEMD_FUZZ=ON -DGPUMEMD_BUILD_TESTS=OFF \
		-DGPUMEMD_FUZZ_SECONDS=$(FUZZ_SECONDS) $(CMAKE_FLAGS)
	cmake --build $(BUILD_FUZZ) -j $(JOBS) --target gm_fuzz
	cd $(BUILD_FUZZ) && ctest --output-on-failure -j 2 -L fuzz

install: build
	DESTDIR=$(DESTDIR) cmake --install $(BUILD) --prefix $(PREFIX)

# The Debian packages (gpumemd, libgpumem0, libgpumem-dev), in $(BUILD)/deb.
deb: deps
	sh packaging/build-deb.sh . $(BUILD)/deb

clean:
	rm -rf $(BUILD) $(BUILD_ASAN) $(BUILD_FUZZ)
