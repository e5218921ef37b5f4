# What a new user meets first (tests/integration/test_newuser.c): the default socket,
# gpumemctl as a non-admin, messages, argument checks, refusal counters and
# text. Real gpumemd, gpumemctl, gm-test-client and gpumem-demo; root (setpriv).
add_executable(test_newuser ${CMAKE_CURRENT_LIST_DIR}/test_newuser.c)
target_link_libraries(test_newuser PRIVATE gm_testutil gpumem PkgConfig::CHECK)
target_compile_definitions(test_newuser PRIVATE GPUMEMCTL_BIN="$<TARGET_FILE:gpumemctl>" GPUMEMD_BIN="$<TARGET_FILE:gpumemd>"
  GM_TEST_CLIENT="$<TARGET_FILE:gm-test-client>" GPUMEM_DEMO_BIN="$<TARGET_FILE:gpumem-demo>"
  GPUMEM_VERSION="${PROJECT_VERSION}")
add_dependencies(test_newuser gpumemd gpumemctl gm-test-client gpumem-demo)
foreach(heap central local)
  add_test(NAME newuser_host_${heap} COMMAND test_newuser)
  set_tests_properties(newuser_host_${heap} PROPERTIES ENVIRONMENT "GPUMEM_TEST_BACKEND=host;GPUMEM_HEAP=${heap}"
                       TIMEOUT 600 SKIP_RETURN_CODE 77)
endforeach()
