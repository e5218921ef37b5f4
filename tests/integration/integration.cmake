# End-to-end suite: real gpumemd + client processes. Runs on the host backend,
# and again on the cuda backend over the emulated driver when it is built.
if(TARGET gm_fakecuda_check)
  # The cuda legs share one emulated device each (its pool file): a fresh one every run.
  set(GM_FAKE_POOLS ${CMAKE_BINARY_DIR}/tests/fakecuda/pool-integration ${CMAKE_BINARY_DIR}/tests/fakecuda/pool-tenants
      ${CMAKE_BINARY_DIR}/tests/fakecuda/pool-restart ${CMAKE_BINARY_DIR}/tests/fakecuda/pool-integration-local)
  add_test(NAME fakecuda_pools_reset COMMAND ${CMAKE_COMMAND} -E rm -f ${GM_FAKE_POOLS})
  set_tests_properties(fakecuda_pools_reset PROPERTIES FIXTURES_SETUP fakecuda_pools)
endif()

add_executable(test_integration ${CMAKE_CURRENT_LIST_DIR}/test_integration.c)
target_link_libraries(test_integration PRIVATE gm_testutil gpumem gm_ipc gm_backend PkgConfig::CHECK Threads::Threads)
find_package(Python3 REQUIRED COMPONENTS Interpreter)
target_compile_definitions(test_integration PRIVATE GPUMEMCTL_BIN="$<TARGET_FILE:gpumemctl>"
  GM_PYTHON3="${Python3_EXECUTABLE}" GPUMEMD_BIN_PATH="$<TARGET_FILE:gpumemd>"
  GPUMEM_LIB_PATH="$<TARGET_FILE:gpumem>" GM_SNAPSHOT_CHECK="${GM_SNAPSHOT_CHECK}")
add_dependencies(test_integration gpumemd gpumemctl)
add_test(NAME integration_host COMMAND test_integration)
set_tests_properties(integration_host PROPERTIES ENVIRONMENT "GPUMEM_TEST_BACKEND=host;GPUMEM_HEAP=central" TIMEOUT 900)
if(GPUMEM_HAVE_CUDA AND TARGET fakecuda)
  add_dependencies(test_integration fakecuda fakenvml)
  add_test(NAME integration_cuda COMMAND test_integration)
  set_tests_properties(integration_cuda PROPERTIES
    ENVIRONMENT "GPUMEM_TEST_BACKEND=cuda;GPUMEM_HEAP=central;GPUMEM_LIBCUDA=${GPUMEM_FAKECUDA};GPUMEM_LIBNVML=${GPUMEM_FAKENVML};FAKECUDA_CAPACITY=4G;FAKECUDA_POOL=${CMAKE_BINARY_DIR}/tests/fakecuda/pool-integration"
    TIMEOUT 900 FIXTURES_REQUIRED fakecuda_pools)
endif()

add_test(NAME integration_host_local COMMAND test_integration)
set_tests_properties(integration_host_local PROPERTIES ENVIRONMENT "GPUMEM_TEST_BACKEND=host;GPUMEM_HEAP=local"
                     TIMEOUT 900)
if(GPUMEM_HAVE_CUDA AND TARGET fakecuda)
  add_test(NAME integration_cuda_local COMMAND test_integration)
  set_tests_properties(integration_cuda_local PROPERTIES
    ENVIRONMENT "GPUMEM_TEST_BACKEND=cuda;GPUMEM_HEAP=local;GPUMEM_LIBCUDA=${GPUMEM_FAKECUDA};GPUMEM_LIBNVML=${GPUMEM_FAKENVML};FAKECUDA_CAPACITY=4G;FAKECUDA_POOL=${CMAKE_BINARY_DIR}/tests/fakecuda/pool-integration-local"
    TIMEOUT 900 FIXTURES_REQUIRED fakecuda_pools)
endif()

# A client program the tests run as other users (setpriv) or in the background.
add_executable(gm-test-client ${CMAKE_CURRENT_LIST_DIR}/test_client_tool.c)
target_link_libraries(gm-test-client PRIVATE gm_testutil gpumem)
add_dependencies(test_integration gm-test-client)
target_compile_definitions(test_integration PRIVATE GM_TEST_CLIENT="$<TARGET_FILE:gm-test-client>")

# Tenants, quotas, reclaim and isolation with clients under other uids.
add_executable(test_tenants ${CMAKE_CURRENT_LIST_DIR}/test_tenants.c)
target_link_libraries(test_tenants PRIVATE gm_testutil gpumem gm_ipc gm_backend PkgConfig::CHECK)
target_compile_definitions(test_tenants PRIVATE GPUMEMCTL_BIN="$<TARGET_FILE:gpumemctl>"
  GM_TEST_CLIENT="$<TARGET_FILE:gm-test-client>")
add_dependencies(test_tenants gpumemd gpumemctl gm-test-client)
add_test(NAME tenants_host COMMAND test_tenants)
set_tests_properties(tenants_host PROPERTIES ENVIRONMENT "GPUMEM_TEST_BACKEND=host;GPUMEM_HEAP=central" TIMEOUT 900 SKIP_RETURN_CODE 77)
if(GPUMEM_HAVE_CUDA AND TARGET fakecuda)
  add_dependencies(test_tenants fakecuda fakenvml)
  add_test(NAME tenants_cuda COMMAND test_tenants)
  set_tests_properties(tenants_cuda PROPERTIES
    ENVIRONMENT "GPUMEM_TEST_BACKEND=cuda;GPUMEM_HEAP=central;GPUMEM_LIBCUDA=${GPUMEM_FAKECUDA};GPUMEM_LIBNVML=${GPUMEM_FAKENVML};FAKECUDA_CAPACITY=4G;FAKECUDA_POOL=${CMAKE_BINARY_DIR}/tests/fakecuda/pool-tenants"
    TIMEOUT 900 SKIP_RETURN_CODE 77 FIXTURES_REQUIRED fakecuda_pools)
endif()

# The same tenants and restart suites with local heaps (the library's default).
add_test(NAME tenants_host_local COMMAND test_tenants)
set_tests_properties(tenants_host_local PROPERTIES ENVIRONMENT "GPUMEM_TEST_BACKEND=host;GPUMEM_HEAP=local"
                     TIMEOUT 900 SKIP_RETURN_CODE 77)

# `cmake --install` into a temporary prefix, then programs built against it
# with pkg-config and find_package(gpumem).
if(GPUMEMD_ASAN)
  set(GM_INSTALL_CHECK_CFLAGS "-fsanitize=address,undefined")
  # Debian's python3 is not instrumented: an instrumented libgpumem it loads
  # needs the sanitizer runtimes preloaded, and the interpreter's own
  # allocations are not leak-checked (the C suites keep leak checking).
  execute_process(COMMAND ${CMAKE_C_COMPILER} -print-file-name=libasan.so OUTPUT_VARIABLE GM_ASAN_RUNTIME
                  OUTPUT_STRIP_TRAILING_WHITESPACE)
  execute_process(COMMAND ${CMAKE_C_COMPILER} -print-file-name=libubsan.so OUTPUT_VARIABLE GM_UBSAN_RUNTIME
                  OUTPUT_STRIP_TRAILING_WHITESPACE)
  set(GM_PYTHON_SANITIZER_ENV "LD_PRELOAD=${GM_ASAN_RUNTIME}:${GM_UBSAN_RUNTIME} ASAN_OPTIONS=detect_leaks=0")
endif()
add_test(NAME install_consumers COMMAND ${CMAKE_CURRENT_LIST_DIR}/install_check.sh ${CMAKE_BINARY_DIR}
         ${CMAKE_SOURCE_DIR} "${GM_INSTALL_CHECK_CFLAGS}" "${GM_PYTHON_SANITIZER_ENV}")
set_tests_properties(install_consumers PROPERTIES TIMEOUT 300)

# Restarts that lose nothing: a harness playing systemd's fd store.
add_executable(test_restart ${CMAKE_CURRENT_LIST_DIR}/test_restart.c)
target_link_libraries(test_restart PRIVATE gm_testutil gm_ipc gm_backend PkgConfig::CHECK Threads::Threads)
target_compile_definitions(test_restart PRIVATE GPUMEMD_BIN="$<TARGET_FILE:gpumemd>"
  GM_TEST_CLIENT="$<TARGET_FILE:gm-test-client>" SHARED_BIN="$<TARGET_FILE:test_shared>"
  GPUMEMCTL_BIN="$<TARGET_FILE:gpumemctl>")
add_dependencies(test_restart gpumemd gm-test-client test_shared gpumemctl)
add_test(NAME restart_host COMMAND test_restart)
set_tests_properties(restart_host PROPERTIES ENVIRONMENT "GPUMEM_TEST_BACKEND=host;GPUMEM_HEAP=central" TIMEOUT 600)
add_test(NAME restart_host_local COMMAND test_restart)
set_tests_properties(restart_host_local PROPERTIES ENVIRONMENT "GPUMEM_TEST_BACKEND=host;GPUMEM_HEAP=local" TIMEOUT 600)
if(GPUMEM_HAVE_CUDA AND TARGET fakecuda)
  add_dependencies(test_restart fakecuda)
  add_test(NAME restart_cuda COMMAND test_restart)
  set_tests_properties(restart_cuda PROPERTIES
    ENVIRONMENT "GPUMEM_TEST_BACKEND=cuda;GPUMEM_HEAP=central;GPUMEM_LIBCUDA=${GPUMEM_FAKECUDA};FAKECUDA_CAPACITY=4G;FAKECUDA_POOL=${CMAKE_BINARY_DIR}/tests/fakecuda/pool-restart" TIMEOUT 600
    FIXTURES_REQUIRED fakecuda_pools)
endif()
